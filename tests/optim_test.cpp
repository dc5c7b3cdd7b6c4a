// optim: the learning-rate schedules against their closed forms, bad options named, and the
// optimizer interface's state lookup.
// (AdamW against PyTorch is in torch_ref_test; clipping across shards in fsdp_test.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/optim/optimizer.h"

namespace fsdp::optim {
namespace {

TEST(LRSchedule, WarmupThenCosineToMinLr) {
  LRSchedule s({.lr = 1.0, .warmup = 4, .decay = Decay::cosine, .min_lr = 0.1, .decay_end = 14});
  for (int64_t t = 0; t < 4; ++t) EXPECT_DOUBLE_EQ(s.at(t), double(t + 1) / 5.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);  // the peak, at the end of the warmup
  EXPECT_NEAR(s.at(9), 0.1 + 0.5 * (1 + std::cos(std::numbers::pi * 0.5)) * 0.9, 1e-15);
  EXPECT_NEAR(s.at(14), 0.1, 1e-15);
  EXPECT_NEAR(s.at(1000), 0.1, 1e-15);  // and min_lr after
  for (int64_t t = 5; t < 14; ++t) EXPECT_LT(s.at(t), s.at(t - 1));
}

TEST(LRSchedule, LinearAndConstant) {
  LRSchedule lin({.lr = 2.0, .warmup = 0, .decay = Decay::linear, .min_lr = 0.0, .decay_end = 10});
  EXPECT_DOUBLE_EQ(lin.at(0), 2.0);
  EXPECT_DOUBLE_EQ(lin.at(5), 1.0);
  EXPECT_DOUBLE_EQ(lin.at(10), 0.0);
  LRSchedule flat({.lr = 3e-4, .warmup = 2});
  EXPECT_DOUBLE_EQ(flat.at(0), 1e-4);
  EXPECT_DOUBLE_EQ(flat.at(2), 3e-4);
  EXPECT_DOUBLE_EQ(flat.at(99999), 3e-4);
  // A decay that ends inside the warmup jumps to min_lr after it.
  LRSchedule late({.lr = 1.0, .warmup = 5, .decay = Decay::cosine, .min_lr = 0.5, .decay_end = 3});
  EXPECT_DOUBLE_EQ(late.at(5), 0.5);
}

TEST(LRSchedule, BadOptionsAreNamed) {
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { parse_decay("exponential"); }).find("'exponential'"), std::string::npos);
  EXPECT_NE(message([] { LRSchedule({.lr = -1.0}); }).find("lr -1"), std::string::npos);
  EXPECT_NE(message([] { LRSchedule({.warmup = -3}); }).find("warmup -3"), std::string::npos);
  EXPECT_EQ(parse_decay("none"), Decay::constant);
}

// State is found by the group's parameter buffer, whatever the order the groups came in.
TEST(Optimizer, StateByParameterBufferAndZeroGrad) {
  std::vector<ParamGroup> groups;
  for (int64_t n : {5, 7})
    groups.push_back({Tensor::full({n}, 1.0, DType::f32), Tensor::full({n}, 0.5, DType::f32), 0.0});
  AdamW opt({groups[1], groups[0]}, {.lr = 0.1});  // another order than `groups`
  opt.step();
  for (size_t i = 0; i < 2; ++i) {
    auto st = opt.state(groups[i].params);
    ASSERT_EQ(st.size(), 2u);
    EXPECT_EQ(st[0].first, "exp_avg");
    EXPECT_EQ(st[0].second.raw_data(), opt.exp_avg(1 - i).raw_data());
    EXPECT_EQ(st[1].second.raw_data(), opt.exp_avg_sq(1 - i).raw_data());
    EXPECT_NEAR(st[0].second.data<float>()[0], 0.05, 1e-7);  // (1 - beta1) * 0.5
  }
  EXPECT_THROW(opt.state(Tensor::zeros({5}, DType::f32)), Error);
  const Optimizer& base = opt;
  EXPECT_EQ(base.step_count(), 1);
  opt.zero_grad();
  for (const ParamGroup& g : groups)
    EXPECT_EQ(g.grads.to_f64_vector(), std::vector<double>(size_t(g.grads.numel()), 0.0));
}

}  // namespace
}  // namespace fsdp::optim
