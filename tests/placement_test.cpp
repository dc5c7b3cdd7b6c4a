// Parameters that carry their placement (issue 48), at np 4 on a 2 x 2 ("dp", "tp") mesh: a
// column-parallel linear whose weight and bias are Shard(0) on "tp" (placed by hand with
// dist::distribute_parameter), everything fully_shard'ed over mesh["dp"], so FSDP shards the rows
// tp left each rank. Trained with AdamW, it gives the losses of the plain model at one rank over
// the same global batch (the two tp ranks of a dp group see the same rows); its checkpoint loads
// at one rank and at three, each rank's rows equal to the bytes the 2 x 2 run held. Placements
// fully_shard cannot compose (Shard(1), Partial, a mesh that is not one of the parameter's dims)
// are refused by name.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dist_main.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/dtensor.h"
#include "fsdp/distributed/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/fsdp/replicate.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/module.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "test_util.h"

namespace fsdp {
namespace {

constexpr int64_t kIn = 6, kHidden = 7, kCol = 10, kOut = 3, kBatch = 8, kSteps = 4;
constexpr uint64_t kSeed = 1234;

// A column-parallel linear (Megatron's ColumnParallelLinear with gather_output): each tp rank
// holds rows [b, b + n) of the [out, in] weight and of the bias (Shard(0) on "tp") and computes
// those output features; the forward all-gathers them across tp, the backward takes its features'
// columns of dy (so its weight gradient is its rows' whole gradient) and all-reduces dx across tp
// (each rank's dx is its features' share). With no tp group it is a plain linear.
class ColumnParallelLinear : public nn::Module {
 public:
  ColumnParallelLinear(int64_t in, int64_t out, std::shared_ptr<dist::ProcessGroup> tp)
      : Module("ColumnParallelLinear"), out_(out), tp_(std::move(tp)) {
    proj_ = &register_module("proj", std::make_unique<nn::Linear>(in, out, true));
  }
  nn::Linear& proj() { return *proj_; }

 protected:
  Tensor forward_impl(const Tensor& x) override {
    Tensor y = proj_->forward(x);  // [B, out / tp]
    if (!tp_ || tp_->size() == 1) return y;
    const int64_t n = tp_->size(), b = y.size(0), local = y.size(1);
    Tensor blocks = Tensor::empty({n * b, local}, y.dtype(), y.device());
    tp_->all_gather_into_tensor(blocks, y.contiguous())->wait();
    // [tp, B, local] -> [B, tp, local]: rank k's features are columns [k local, (k + 1) local).
    return blocks.reshape({n, b, local}).transpose(0, 1).contiguous().reshape({b, n * local});
  }
  Tensor backward_impl(const Tensor& dy) override {
    if (!tp_ || tp_->size() == 1) return proj_->backward(dy);
    const auto [begin, len] = dist::chunk_range(out_, tp_->size(), tp_->rank());
    Tensor dx = proj_->backward(dy.narrow(1, begin, len).contiguous()).contiguous().clone();
    tp_->all_reduce(dx, dist::ReduceOp::SUM)->wait();
    return dx;
  }

 private:
  int64_t out_;
  std::shared_ptr<dist::ProcessGroup> tp_;
  nn::Linear* proj_;
};

// in -> silu -> column-parallel -> out.
class TinyTP : public nn::Module {
 public:
  explicit TinyTP(std::shared_ptr<dist::ProcessGroup> tp) : Module("TinyTP") {
    in_ = &register_module("in", std::make_unique<nn::Linear>(kIn, kHidden, true));
    col_ = &register_module("col", std::make_unique<ColumnParallelLinear>(kHidden, kCol, tp));
    out_ = &register_module("out", std::make_unique<nn::Linear>(kCol, kOut, false));
  }
  ColumnParallelLinear& col() { return *col_; }

 protected:
  struct Saved {
    Tensor h;
  };
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = in_->forward(x);
    save_for_backward(Saved{h});
    return out_->forward(col_->forward(ops::silu_forward(h)));
  }
  Tensor backward_impl(const Tensor& dy) override {
    const Saved s = take_saved<Saved>();
    return in_->backward(ops::silu_backward(col_->backward(out_->backward(dy)), s.h));
  }

 private:
  nn::Linear *in_, *out_;
  ColumnParallelLinear* col_;
};

// The global batch (one, fitted for kSteps, so the loss falls) and its targets; a dp rank of `dp`
// takes its rows of it.
std::pair<Tensor, Tensor> batch(int dp_rank, int dp, DType dtype) {
  const Tensor x = test::random_tensor({kBatch, kIn}, 100, DType::f64);
  const Tensor t = test::random_tensor({kBatch, kOut}, 200, DType::f64);
  const int64_t rows = kBatch / dp;
  return {x.narrow(0, dp_rank * rows, rows).contiguous().to(dtype),
          t.narrow(0, dp_rank * rows, rows).contiguous().to(dtype)};
}

// AdamW steps on half the mean squared error over this rank's rows; returns each step's loss over
// the global batch (the mean over `dp` of the dp ranks' means: their rows are equal in number).
std::vector<double> train(TinyTP& model, FSDPModule& root, optim::AdamW& opt, int dp_rank, int dp,
                          const std::shared_ptr<dist::ProcessGroup>& dp_group, DType dtype) {
  std::vector<double> losses;
  for (int64_t step = 0; step < kSteps; ++step) {
    auto [x, t] = batch(dp_rank, dp, dtype);
    root.zero_grad();
    const Tensor y = model.forward(x);
    const std::vector<double> yv = y.to_f64_vector(), tv = t.to_f64_vector();
    std::vector<double> dy(yv.size());
    double loss = 0;
    for (size_t i = 0; i < yv.size(); ++i) {
      loss += 0.5 * (yv[i] - tv[i]) * (yv[i] - tv[i]) / double(yv.size());
      dy[i] = (yv[i] - tv[i]) / double(yv.size());
    }
    model.backward(Tensor::from_vector(dy, y.shape()).to(dtype));
    opt.step();
    if (dp_group && dp_group->size() > 1) {
      Tensor l = Tensor::full({1}, loss, DType::f64);
      dp_group->all_reduce(l, dist::ReduceOp::SUM)->wait();
      loss = l.to_f64_vector()[0] / dp;
    }
    losses.push_back(loss);
  }
  return losses;
}

// The plain model fully_shard'ed over `group` (one rank: the reference).
struct Plain {
  TinyTP model{nullptr};
  FSDPModule* root = nullptr;
  std::unique_ptr<optim::AdamW> opt;
  Plain(const std::shared_ptr<dist::ProcessGroup>& group, DType dtype) {
    auto mesh = std::make_shared<dist::DeviceMesh>(group, std::vector<int64_t>{group->size()});
    root = &fully_shard(model, mesh, {.init_dtype = dtype, .seed = kSeed});
    opt = std::make_unique<optim::AdamW>(root->param_groups(0.01), ops::AdamWHyper{.lr = 1e-2});
  }
};

// The 2 x 2 layout: the column-parallel weight and bias Shard(0) on "tp", fully_shard over "dp".
struct TwoByTwo {
  std::shared_ptr<dist::DeviceMesh> mesh = dist::init_device_mesh({2, 2}, {"dp", "tp"});
  TinyTP model{mesh->group("tp")};
  FSDPModule* root = nullptr;
  std::unique_ptr<optim::AdamW> opt;
  explicit TwoByTwo(DType dtype) {
    for (nn::Parameter* p : {&model.col().proj().weight(), model.col().proj().bias()})
      dist::distribute_parameter(*p, mesh, {dist::Replicate{}, dist::Shard{0}});
    root = &fully_shard(model, (*mesh)["dp"], {.init_dtype = dtype, .seed = kSeed});
    opt = std::make_unique<optim::AdamW>(root->param_groups(0.01), ops::AdamWHyper{.lr = 1e-2});
  }
};

std::shared_ptr<dist::ProcessGroup> solo() {
  return dist::world()->split(dist::world()->rank(), 0);
}

bool four_ranks() { return dist::world()->size() == 4; }

TEST(Placements, ColumnParallelUnderFullyShardTrainsAsOneRank) {
  if (!four_ranks()) GTEST_SKIP() << "the 2 x 2 mesh needs 4 ranks";
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Plain ref(solo(), dtype);
    const std::vector<double> want = train(ref.model, *ref.root, *ref.opt, 0, 1, nullptr, dtype);
    TwoByTwo tp(dtype);
    const int dp_rank = int(tp.mesh->local_rank(0));
    const std::vector<double> got =
        train(tp.model, *tp.root, *tp.opt, dp_rank, 2, tp.mesh->group("dp"), dtype);
    // The tp rank's weight rows: its chunk of 10, which fully_shard split again over dp (5 rows:
    // 3 and 2, uneven).
    const auto infos = tp.root->shard_infos();
    for (const auto& in : infos)
      if (in.name == "col.proj.weight") {
        const auto [tb, tl] = dist::chunk_range(kCol, 2, tp.mesh->local_rank(1));
        const auto [db, dl] = dist::chunk_range(tl, 2, dp_rank);
        EXPECT_EQ(in.global_shape, (Shape{kCol, kHidden}));
        EXPECT_EQ(in.local_begin, tb + db);
        EXPECT_EQ(in.local_rows, dl);
        EXPECT_EQ(in.fsdp_dim, 0);
        EXPECT_EQ(in.placements,  // FSDP2's (_StridedShard(0, split_factor=2), Shard(0))
                  (std::vector<dist::Placement>{dist::Shard{.dim = 0, .split_factor = 2},
                                                dist::Shard{0}}));
      }
    double most = 0;
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < want.size(); ++s) {
      const double rel = std::fabs(got[s] - want[s]) / std::fabs(want[s]);
      most = std::max(most, rel);
      EXPECT_LT(rel, dtype == DType::f32 ? 1e-6 : 1e-12)
          << "step " << s << ": " << got[s] << " at 2 x 2, " << want[s] << " at one rank";
    }
    EXPECT_LT(want.back(), want.front());  // it trains
    if (dist::world()->rank() == 0)
      fmt::print(
          "[placement_test] {}: losses {:.6g} .. {:.6g}, largest relative difference to "
          "one rank {:.3g}\n",
          dtype_name(dtype), want.front(), want.back(), most);
  }
}

// Name -> this rank's rows of the parameter and of AdamW's state, with the first row.
struct Rows {
  int64_t begin = 0;
  std::vector<std::vector<double>> values;  // param, then each optimizer state
};
std::map<std::string, Rows> rows_of(FSDPModule& root, const optim::AdamW& opt) {
  std::map<std::string, Rows> out;
  auto groups = root.param_groups(0);
  for (const auto& in : root.shard_infos()) {
    const int64_t row = shape_numel(in.global_shape) / in.global_shape[0];
    Rows r{in.local_begin, {}};
    std::vector<Tensor> flats = {groups[in.group].params};
    for (auto& [name, t] : opt.state(groups[in.group].params)) flats.push_back(t);
    for (const Tensor& f : flats)
      r.values.push_back(f.slice(in.offset, in.offset + in.local_rows * row).to_f64_vector());
    out[in.name] = r;
  }
  return out;
}

TEST(Placements, CheckpointAtTwoByTwoLoadsAtOneAndThreeRanks) {
  if (!four_ranks()) GTEST_SKIP() << "the 2 x 2 mesh needs 4 ranks";
  const DType dtype = DType::f32;
  TwoByTwo tp(dtype);
  train(tp.model, *tp.root, *tp.opt, int(tp.mesh->local_rank(0)), 2, tp.mesh->group("dp"), dtype);
  const std::string run = checkpoint::new_run_id(dist::world());
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("fsdp_placement_test_" + run)).string();
  checkpoint::save(dir, kSteps, *tp.root, *tp.opt, "{}", 0, dist::world(), {.run_id = run});
  const std::string path = checkpoint::latest(dir);
  ASSERT_FALSE(path.empty());

  // One rank: every rank loads the whole model on a group of its own.
  Plain one(solo(), dtype);
  checkpoint::load(path, *one.root, *one.opt, "{}", {});
  const auto whole = rows_of(*one.root, *one.opt);
  auto check = [&](const std::map<std::string, Rows>& part, const std::string& what) {
    ASSERT_EQ(part.size(), whole.size()) << what;
    for (const auto& [name, r] : part) {
      const Rows& w = whole.at(name);
      ASSERT_EQ(r.values.size(), w.values.size()) << what << " " << name;
      ASSERT_EQ(w.begin, 0);
      for (size_t k = 0; k < r.values.size(); ++k) {
        if (r.values[k].empty()) continue;
        const auto& shape = one.model.parameter(name).global_shape();
        const size_t row = size_t(shape_numel(shape) / shape[0]);
        for (size_t i = 0; i < r.values[k].size(); ++i)
          ASSERT_EQ(r.values[k][i], w.values[k][size_t(r.begin) * row + i])
              << what << ": " << name << " (tensor " << k << ") element " << i << " of rows from "
              << r.begin;
      }
    }
  };
  check(rows_of(*tp.root, *tp.opt), "2 x 2 against its load at one rank");
  // sharded_parameters(): the column-parallel weight is a DTensor of its global shape on the
  // 2 x 2 mesh, and every parameter's full_tensor() (collective) is the one-rank load's.
  std::map<std::string, std::vector<double>> full1;
  for (auto& [name, d] : one.root->sharded_parameters())
    full1[name] = d.full_tensor().to_f64_vector();
  for (auto& [name, d] : tp.root->sharded_parameters()) {
    if (name == "col.proj.weight") {
      EXPECT_EQ(d.shape(), (Shape{kCol, kHidden}));
      EXPECT_EQ(d.mesh(), tp.mesh);
    }
    EXPECT_EQ(d.full_tensor().to_f64_vector(), full1.at(name)) << name;
  }

  // Three ranks: ranks 0..2 load it over a group of three (rank 3 makes a group of one and
  // stands by).
  const int me = dist::world()->rank();
  auto three = dist::world()->split(me < 3 ? 0 : 1, me);
  if (me < 3) {
    Plain p3(three, dtype);
    checkpoint::load(path, *p3.root, *p3.opt, "{}", {});
    check(rows_of(*p3.root, *p3.opt), "its load at three ranks against its load at one");
  }
  dist::world()->barrier()->wait();
  if (me == 0) std::filesystem::remove_all(dir);
}

TEST(Placements, RefusesWhatFullyShardCannotCompose) {
  if (!four_ranks()) GTEST_SKIP() << "the 2 x 2 mesh needs 4 ranks";
  auto mesh = dist::init_device_mesh({2, 2}, {"dp", "tp"});
  auto expect_refused = [](const std::function<void()>& fn, const std::vector<std::string>& says) {
    try {
      fn();
      ADD_FAILURE() << "not refused";
    } catch (const Error& e) {
      for (const std::string& s : says)
        EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what() << "\n lacks " << s;
    }
  };
  {  // Shard(1) on tp: a row-parallel weight's columns
    nn::Linear m(kIn, kCol, false);
    dist::distribute_parameter(m.weight(), mesh, {dist::Replicate{}, dist::Shard{1}});
    expect_refused([&] { fully_shard(m, (*mesh)["dp"]); }, {"'weight'", "Shard(1)", "'tp'"});
  }
  {  // Partial: not a parameter's placement, when placed by hand, nor in fully_shard
    nn::Linear m(kIn, kCol, false);
    expect_refused(
        [&] {
          dist::distribute_parameter(m.weight(), mesh, {dist::Replicate{}, dist::Partial{}});
        },
        {"'weight'", "Partial(sum)"});
    auto pl = std::make_shared<dist::ParameterPlacement>();
    pl->global_shape = m.weight().shape;
    pl->mesh = mesh;
    pl->placements = {dist::Replicate{}, dist::Partial{}};
    m.weight().placement = pl;
    expect_refused([&] { fully_shard(m, (*mesh)["dp"]); }, {"'weight'", "Partial(sum)"});
  }
  {  // a mesh that is none of the parameter's dims, and Shard(0) on fully_shard's own dim
    nn::Linear a(kIn, kCol, false), b(kIn, kCol, false);
    dist::distribute_parameter(a.weight(), mesh, {dist::Replicate{}, dist::Shard{0}});
    expect_refused([&] { fully_shard(a, dist::init_device_mesh({4})); },
                   {"'weight'", "none of its mesh's dims"});
    dist::distribute_parameter(b.weight(), mesh, {dist::Shard{0}, dist::Replicate{}});
    expect_refused([&] { fully_shard(b, (*mesh)["dp"]); }, {"'weight'", "expected Replicate()"});
    // replicate() (whole-model buffers, a world-wide all-reduce) takes no placed parameter
    expect_refused([&] { replicate(a, dist::init_device_mesh({4})); }, {"'weight'", "placed"});
  }
}

}  // namespace
}  // namespace fsdp

int main(int argc, char** argv) { return fsdp::test::dist_test_main(argc, argv, "placement_test"); }
