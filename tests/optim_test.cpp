// optim: the learning-rate schedules against their closed forms, bad options named, and the
// optimizer interface's state lookup.
// (AdamW against PyTorch is in torch_ref_test; clipping across shards in fsdp_test.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/clip.h"
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

// AdamW::step_clipped scales each gradient as it reads it, in one multi-tensor pass: the same bits
// as clipping in place (clip_grad_norm) and then stepping, over tensors of several sizes (one
// under a tile, several over a thread's chunk), decayed and undecayed runs, f32 and f64, with
// the clipping on and off; the gradients are left as they were.
TEST(AdamW, ClippedStepInOnePassIsBitIdenticalToClippingFirst) {
  for (DType dt : {DType::f32, DType::f64})
    for (double max_norm : {0.5, 1e9}) {
      uint64_t seed = 12345;
      auto next = [&] {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        return double(int64_t(seed >> 11) - (int64_t(1) << 52)) / double(int64_t(1) << 52);
      };
      std::vector<ParamGroup> fused, first;
      std::vector<std::vector<double>> grads;
      for (int64_t n : {int64_t(3), int64_t(257), int64_t(40000), int64_t(70001)}) {
        std::vector<double> p(static_cast<size_t>(n)), g(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) p[size_t(i)] = next(), g[size_t(i)] = next();
        grads.push_back(g);
        for (auto* groups : {&fused, &first}) {
          ParamGroup pg{Tensor::from_vector(p, {n}).to(dt), Tensor::from_vector(g, {n}).to(dt), 0.1};
          if (n > 300) pg.no_decay = {{100, 200}};
          groups->push_back(pg);
        }
      }
      AdamW a(fused, {.lr = 1e-2}), b(first, {.lr = 1e-2});
      for (int step = 0; step < 3; ++step) {
        const GradNorm norm = clip_grad_norm_async(fused, 0, nullptr);  // measured only
        a.step_clipped({.total_sq = norm.total_sq, .max_norm = max_norm});
        EXPECT_EQ(clip_grad_norm(first, max_norm, nullptr), norm.value());  // scaled in place
        b.step();
        for (size_t i = 0; i < fused.size(); ++i) {
          const std::string where = fmt::format("{} max_norm {} step {} tensor {}",
                                                dtype_name(dt), max_norm, step, i);
          EXPECT_EQ(fused[i].params.to_f64_vector(), first[i].params.to_f64_vector()) << where;
          EXPECT_EQ(a.exp_avg(i).to_f64_vector(), b.exp_avg(i).to_f64_vector()) << where;
          EXPECT_EQ(a.exp_avg_sq(i).to_f64_vector(), b.exp_avg_sq(i).to_f64_vector()) << where;
          const Tensor given = Tensor::from_vector(grads[i], {fused[i].grads.numel()}).to(dt);
          EXPECT_EQ(fused[i].grads.to_f64_vector(), given.to_f64_vector())
              << where << ": the gradients are read, not scaled";
        }
        if (max_norm < 1) ASSERT_GT(norm.value(), max_norm) << "the clipping must act";
        for (size_t i = 0; i < first.size(); ++i) first[i].grads.copy_(fused[i].grads);
      }
    }
}

// An optimizer that does not override step_clipped gets the gradients clipped in place first.
TEST(Optimizer, StepClippedByDefaultScalesTheGradientsThenSteps) {
  struct Sgd final : Optimizer {
    using Optimizer::Optimizer;
    void step() override {
      for (const ParamGroup& g : groups_) ops::add_(g.params, g.grads);  // the clipped gradients
    }
    void set_lr(double) override {}
    double lr() const override { return 1; }
    int64_t step_count() const override { return 0; }
    void set_step_count(int64_t) override {}
    std::vector<std::pair<std::string, Tensor>> state(const Tensor&) const override { return {}; }
  };
  std::vector<ParamGroup> groups{{Tensor::zeros({2}, DType::f64),
                                  Tensor::from_vector(std::vector<double>{3, 4}, {2}), 0.0}};
  Sgd opt(groups);
  const GradNorm norm = clip_grad_norm_async(groups, 0, nullptr);  // 5
  opt.step_clipped({.total_sq = norm.total_sq, .max_norm = 1.0});
  const double c = 1.0 / (5.0 + 1e-6);
  EXPECT_EQ(groups[0].params.to_f64_vector(), (std::vector<double>{3 * c, 4 * c}));
}

}  // namespace
}  // namespace fsdp::optim
