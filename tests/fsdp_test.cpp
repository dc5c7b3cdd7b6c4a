// fully_shard with real ranks (mpirun -np 1..4 under MPI, scripts/fsdprun
// under Gloo). The 5-step loss trajectory and the final parameters at every
// world size equal an unsharded model trained on the same global batch in
// this process; memory follows the formula; the order of events shows the
// prefetch and the reduce-scatter overlapping compute; bad input is named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/core/allocator.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/distributed/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/fsdp/replicate.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/clip.h"
#include "fsdp/profiler/metrics.h"
#include "fsdp/train/step.h"
#include "src/distributed/device_host_group.h"
#include "src/fsdp/fsdp_state.h"
#include "test_util.h"

namespace fsdp {
namespace {

using dist::world;

constexpr int64_t kGlobalRows = 12;  // divisible by 1, 2, 3 and 4 ranks
constexpr int kSteps = 5;
constexpr uint64_t kSeed = 7;

struct Run {
  nn::Arch arch = nn::Arch::decoder;
  DType dtype = DType::f64;
  bool reshard_after_forward = true;
  int64_t hsdp = 0;  // replica groups
  int64_t accum = 1;
  std::optional<DType> param_dtype;
  // llama's options: grouped-query attention, a head dim of its own, tied head, q/k/v biases,
  // q/k norms (Qwen3)
  int64_t kv_heads = 0, head_dim = 0;
  bool tied = false, qkv_bias = false, qk_norm = false;
  int64_t ac_every = 0;  // activation checkpointing on blocks 0, N, 2N, ...; 0: off
  bool masked = false;   // targets masked unevenly over the ranks (SkewedMaskSource)
  bool all_masked = false;  // every target masked
  nn::LoraConfig lora;      // adapters; the base frozen
  std::optional<DType> frozen_dtype;  // the base's sharded dtype (computed in it; adapters f32)
};

// Random tokens whose first targets in each row are ignored (kIgnoreIndex), the more the later the
// row sits in its global batch: rank 0's rows keep nearly all their targets, the last rank's few,
// and the batch's last row none. The loss is then the mean over the global batch's targets, which
// a mean of the ranks' means is not.
class SkewedMaskSource final : public data::TokenSource {
 public:
  SkewedMaskSource(int64_t vocab, bool all) : base_(vocab, kSeed), all_(all) {}
  data::Batch windows(int64_t first, int64_t rows, int64_t seq) const override {
    data::Batch b = base_.windows(first, rows, seq);
    b.targets = b.targets.contiguous().clone();
    int32_t* t = b.targets.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t q = (first + r) % kGlobalRows;
      const int64_t ignored = all_ || q == kGlobalRows - 1 ? seq : q * seq / kGlobalRows;
      for (int64_t j = 0; j < ignored; ++j) t[r * seq + j] = int32_t(kIgnoreIndex);
    }
    return b;
  }
  bool masks_targets() const override { return true; }
  std::string describe() const override { return "random tokens, skewed target masks"; }

 private:
  data::RandomTokenSource base_;
  bool all_;
};

std::shared_ptr<const data::TokenSource> source(const Run& run, int64_t vocab) {
  if (run.masked || run.all_masked) return std::make_shared<SkewedMaskSource>(vocab, run.all_masked);
  return std::make_shared<data::RandomTokenSource>(vocab, kSeed);
}

// Dims that do not divide by 3 or 4, so the shards are uneven.
nn::TransformerConfig config(nn::Arch arch) {
  nn::TransformerConfig c;
  c.arch = arch;
  c.vocab = 37;
  c.dim = 20;
  c.layers = 3;
  c.heads = arch == nn::Arch::decoder ? 2 : 4;
  c.seq = 6;
  c.ffn_hidden = 22;
  return c;
}

nn::TransformerConfig config(const Run& run) {
  nn::TransformerConfig c = config(run.arch);
  if (run.kv_heads) c.heads = 4, c.kv_heads = run.kv_heads, c.head_dim = run.head_dim;
  c.tie_embeddings = run.tied;
  c.qkv_bias = run.qkv_bias;
  c.qk_norm = run.qk_norm;
  c.lora = run.lora;
  return c;
}

struct Result {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;  // full values after the last step
};

// The unsharded model, one process, the whole global batch.
Result reference(const Run& run) {
  nn::TransformerConfig c = config(run);
  nn::Transformer model(c);
  auto flat = nn::materialize(model, run.dtype, kSeed);
  std::vector<nn::ParamGroup> groups = {{flat.params, flat.grads, 0.01}};
  if (c.lora.enabled()) {  // only the adapters step (the frozen base has no gradient view)
    groups.clear();
    for (auto& [n, p] : model.named_parameters())
      if (p->requires_grad) groups.push_back({p->data.view({-1}), p->grad.view({-1}), 0.01});
  }
  optim::AdamW opt(groups, {.lr = 1e-2});
  const auto src = source(run, c.vocab);
  const int64_t rows = kGlobalRows * run.accum;
  Result r;
  for (int step = 0; step < kSteps; ++step) {
    flat.grads.zero_();
    auto b = src->batch(step, rows, 0, rows, c.seq);
    // The mean over the batch's targets: all of its positions, or those a mask leaves.
    double targets = 0;
    for (int64_t i = 0; i < b.targets.numel(); ++i)
      targets += b.targets.data<int32_t>()[i] != int32_t(kIgnoreIndex);
    Tensor logits = model.forward(b.inputs).view({rows * c.seq, c.vocab});
    auto x = ops::cross_entropy_forward(logits, b.targets, true, targets);
    model.backward(ops::cross_entropy_backward(logits, b.targets, x.lse, 1.0, targets)
                       .view({rows, c.seq, c.vocab}));
    opt.step();
    r.losses.push_back(x.loss);
  }
  for (auto& [n, p] : model.named_parameters()) r.params.emplace_back(n, p->data.clone());
  return r;
}

// kSteps of train_step (fsdp-train's step) over each rank's rows of the global batches, without
// clipping: the losses, the mean over ranks. Every step waits for the device once.
std::vector<double> train_losses(nn::Module& model, DataParallelModule& parallel,
                                 optim::Optimizer& opt, const nn::TransformerConfig& c,
                                 const Run& run) {
  data::DataLoader loader(source(run, c.vocab), kGlobalRows, world()->rank(), world()->size(),
                          c.seq);
  const train::StepParts parts{
      .model = model, .parallel = parallel, .optimizer = opt, .loader = loader, .group = *world()};
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    const profiler::StepMetrics m =
        train::train_step(parts, step, {.grad_accum = run.accum, .grad_clip = 0});
    EXPECT_EQ(m.host_syncs, 1) << "step " << step;
    losses.push_back(m.loss);
  }
  return losses;
}

Result sharded(const Run& run, bool train = true) {
  nn::TransformerConfig c = config(run);
  const int N = world()->size();
  auto mesh = run.hsdp ? dist::init_device_mesh({run.hsdp, N / run.hsdp}, {"replicate", "shard"})
                       : dist::init_device_mesh({N}, {"shard"});
  nn::Transformer model(c);
  FullyShardOptions fo{
      .reshard_after_forward = run.reshard_after_forward, .init_dtype = run.dtype, .seed = kSeed};
  if (run.param_dtype) fo.mp_policy = {.param_dtype = run.param_dtype, .reduce_dtype = DType::f32};
  if (run.frozen_dtype) {
    fo.frozen_dtype = run.frozen_dtype;
    fo.mp_policy = {.param_dtype = run.frozen_dtype, .reduce_dtype = DType::f32};
  }
  for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers()[i], mesh, fo);
  FSDPModule& root = fully_shard(model, mesh, fo);
  if (run.ac_every > 0)
    for (size_t i = 0; i < model.layers().size(); i += size_t(run.ac_every))
      model.layers()[i].set_activation_checkpoint(true);
  optim::AdamW opt(root.param_groups(0.01), {.lr = 1e-2});
  Result r;
  if (train) r.losses = train_losses(model, root, opt, c, run);
  for (auto& [n, d] : root.sharded_parameters()) r.params.emplace_back(n, d.full_tensor());
  return r;
}

void expect_equivalent(const Run& run, double loss_tol, double param_tol) {
  Result ref = reference(run), got = sharded(run);
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], ref.losses[s], loss_tol * std::abs(ref.losses[s])) << "step " << s;
  ASSERT_EQ(got.params.size(), ref.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i) {
    EXPECT_EQ(got.params[i].first, ref.params[i].first);
    EXPECT_LT(test::rel_error(got.params[i].second, ref.params[i].second), param_tol)
        << ref.params[i].first;
  }
}

TEST(Equivalence, F64MatchesOneRank) { expect_equivalent({}, 1e-10, 1e-10); }
TEST(Equivalence, F32MatchesOneRank) { expect_equivalent({.dtype = DType::f32}, 1e-5, 1e-4); }
TEST(Equivalence, SeedArchitecture) { expect_equivalent({.arch = nn::Arch::seed}, 1e-10, 1e-10); }
TEST(Equivalence, NoReshardAfterForward) {
  expect_equivalent({.reshard_after_forward = false}, 1e-10, 1e-10);
}
TEST(Equivalence, GradientAccumulationEqualsALargerBatch) {
  expect_equivalent({.accum = 2}, 1e-10, 1e-10);
}
// A loss mask (SFT's: only the replies are targets) that leaves the ranks very different numbers
// of targets: the loss and gradients are those of one rank holding the whole batch, the sum over
// every target divided by their count, with and without accumulation, in f64 and f32.
TEST(Equivalence, MaskedTargetsAveragedOverTheGlobalBatch) {
  expect_equivalent({.masked = true}, 1e-10, 1e-10);
  expect_equivalent({.accum = 2, .masked = true}, 1e-10, 1e-10);
  expect_equivalent({.dtype = DType::f32, .accum = 2, .masked = true}, 1e-5, 1e-4);
}
// Grouped-query attention (4 query heads over 2 kv heads, and over 1), head dim 6 (not dim 20 /
// 4), q/k/v biases and the head tied to the embedding: one parameter, "embed.weight", in the root's
// group, whose gradient sums the head's dW and the embedding's scatter-add before the
// reduce-scatter; the same losses and parameters as one unsharded rank.
// A global batch with no target at all (every position masked, as a chat cut before its first
// reply can be) has nothing to learn from: its loss is zero and the optimizer does not step, so
// AdamW's weight decay leaves the weights as they were.
TEST(Equivalence, AllMaskedBatchesLeaveTheWeights) {
  const Result got = sharded({.all_masked = true}), init = sharded({}, false);
  for (double l : got.losses) EXPECT_EQ(l, 0.0);
  ASSERT_EQ(got.params.size(), init.params.size());
  for (size_t i = 0; i < init.params.size(); ++i)
    EXPECT_EQ(test::rel_error(got.params[i].second, init.params[i].second), 0.0)
        << init.params[i].first;
}
TEST(Equivalence, GroupedQueryTiedLlama) {
  expect_equivalent({.kv_heads = 2, .head_dim = 6, .tied = true, .qkv_bias = true}, 1e-10, 1e-10);
  expect_equivalent({.kv_heads = 1, .head_dim = 6, .tied = true}, 1e-10, 1e-10);
  expect_equivalent({.kv_heads = 2, .head_dim = 6, .qk_norm = true}, 1e-10, 1e-10);
  nn::Transformer model(config(fsdp::Run{.kv_heads = 2, .head_dim = 6, .tied = true}));
  auto mesh = dist::init_device_mesh({world()->size()});
  for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers()[i], mesh);
  FSDPModule& root = fully_shard(model, mesh);
  int embeds = 0;
  for (auto& [n, d] : root.sharded_parameters()) {
    EXPECT_NE(n, "head.weight");
    embeds += n == "embed.weight";
  }
  EXPECT_EQ(embeds, 1);
  EXPECT_EQ(root.param_groups(0.0).size(), model.layers().size() + 1);
}
// One forward and backward of two rows of random tokens, with the root's event log on: its events.
std::vector<std::string> logged_step(nn::Transformer& model, FSDPModule& root,
                                     const nn::TransformerConfig& c) {
  data::RandomTokenSource src(c.vocab, kSeed);
  root.set_event_log(true);
  auto b = src.batch(0, 2, 0, 2, c.seq);
  Tensor logits = model.forward(b.inputs).view({2 * c.seq, c.vocab});
  auto x = ops::cross_entropy_forward(logits, b.targets);
  model.backward(ops::cross_entropy_backward(logits, b.targets, x.lse).view({2, c.seq, c.vocab}));
  return root.take_event_log();
}

// LoRA: adapters on every projection, the base frozen: the losses and every parameter equal one
// unsharded rank's (whose optimizer steps the adapters alone), with accumulation and HSDP; the
// frozen groups have no gradient buffer (param_groups' grads undefined), the optimizer keeps no
// state for them, and the backward reduces only the adapters: each block's reduce-scatter is its
// trainable group's, never the frozen one's. The base's values stay their initial ones.
TEST(Equivalence, LoraAdaptersOnAFrozenShardedBase) {
  const nn::LoraConfig lora{
      .rank = 2, .alpha = 4.0, .targets = nn::parse_lora_targets("q,k,v,o,gate,up,down")};
  expect_equivalent({.lora = lora}, 1e-10, 1e-10);
  expect_equivalent({.accum = 2, .masked = true, .lora = lora}, 1e-10, 1e-10);
  expect_equivalent({.kv_heads = 2, .head_dim = 6, .tied = true, .lora = lora}, 1e-10, 1e-10);
  const nn::LoraConfig qv{.rank = 3, .alpha = 3.0, .targets = nn::parse_lora_targets("q,v")};
  expect_equivalent({.dtype = DType::f32, .lora = qv}, 1e-5, 1e-4);
  if (world()->size() == 4) expect_equivalent({.hsdp = 2, .lora = lora}, 1e-10, 1e-10);
  const Result init = sharded({.lora = lora}, false), got = sharded({.lora = lora});
  for (size_t i = 0; i < init.params.size(); ++i) {
    const bool adapter = nn::is_lora_parameter(init.params[i].first);
    const double moved = test::rel_error(got.params[i].second, init.params[i].second);
    if (adapter && init.params[i].first.ends_with("lora_B")) EXPECT_GT(moved, 0.0);
    if (!adapter) EXPECT_EQ(moved, 0.0) << init.params[i].first;
  }

  nn::TransformerConfig c = config(fsdp::Run{.lora = lora});
  nn::Transformer model(c);
  auto mesh = dist::init_device_mesh({world()->size()});
  const FullyShardOptions fo{.init_dtype = DType::f64, .seed = kSeed};
  for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers()[i], mesh, fo);
  FSDPModule& root = fully_shard(model, mesh, fo);
  const std::vector<nn::ParamGroup> groups = root.param_groups(0.0);
  int frozen = 0;
  for (const nn::ParamGroup& g : groups) frozen += !g.grads.defined();
  EXPECT_EQ(frozen, int(model.layers().size()) + 1);        // every block's base, and the root's
  EXPECT_EQ(groups.size(), 2 * model.layers().size() + 1);  // the root adapts nothing
  optim::AdamW opt(groups, {.lr = 1e-2});
  for (const nn::ParamGroup& g : groups) EXPECT_EQ(opt.state(g.params).empty(), !g.grads.defined());
  int64_t adapter_elems = 0;
  for (const nn::ParamGroup& g : groups)
    if (g.grads.defined()) adapter_elems += g.params.numel();
  EXPECT_EQ(opt.state_bytes(), 2 * adapter_elems * int64_t(sizeof(double)));
  const std::vector<std::string> log = logged_step(model, root, c);
  int rs = 0, frozen_gathers = 0;
  for (const std::string& e : log) {
    if (e.rfind("rs_issue:", 0) == 0 || e.rfind("grad_add:", 0) == 0) {
      EXPECT_EQ(e.find("(frozen)"), std::string::npos) << e;
      EXPECT_NE(e, "rs_issue:<root>") << "the root holds no adapter";
      ++rs;
    }
    frozen_gathers += e.rfind("ag_issue:", 0) == 0 && e.find("(frozen)") != std::string::npos;
  }
  if (world()->size() > 1) {
    EXPECT_EQ(rs, int(model.layers().size()));
    EXPECT_GE(frozen_gathers, int(model.layers().size()) + 1);
  }
}
// A bf16 base beside f32 adapters (fsdp-train --dtype bf16 --lora-rank): the frozen groups are
// sharded in bf16 and gathered without a cast, the adapters keep f32 masters and AdamW state
// (computed in bf16, reduced in f32). The losses and adapters are those of an f32 base gathered
// into bf16 (the same bf16 values at use: the base's init rounded once or through f32 may differ
// in a last bit), and follow the f32 run as bf16 compute does.
TEST(Equivalence, LoraOnABf16Base) {
  const nn::LoraConfig lora{.rank = 2, .alpha = 4.0, .targets = nn::parse_lora_targets("q,v,down")};
  const Result half = sharded({.dtype = DType::f32, .lora = lora, .frozen_dtype = DType::bf16});
  const Result cast = sharded({.dtype = DType::f32, .param_dtype = DType::bf16, .lora = lora});
  const Result full = reference({.dtype = DType::f32, .lora = lora});
  ASSERT_EQ(half.losses.size(), cast.losses.size());
  for (size_t s = 0; s < half.losses.size(); ++s) {
    EXPECT_NEAR(half.losses[s], cast.losses[s], 1e-6 * cast.losses[s]) << "step " << s;
    EXPECT_NEAR(half.losses[s], full.losses[s], 2e-2 * full.losses[s]) << "step " << s;
  }
  for (size_t i = 0; i < half.params.size(); ++i)
    if (nn::is_lora_parameter(half.params[i].first))
      EXPECT_LT(test::rel_error(half.params[i].second, cast.params[i].second), 1e-4)
          << half.params[i].first;
  nn::TransformerConfig c = config(fsdp::Run{.lora = lora});
  nn::Transformer model(c);
  auto mesh = dist::init_device_mesh({world()->size()});
  const FullyShardOptions fo{.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = DType::f32},
                             .init_dtype = DType::f32,
                             .seed = kSeed,
                             .frozen_dtype = DType::bf16};
  for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers()[i], mesh, fo);
  FSDPModule& root = fully_shard(model, mesh, fo);
  for (const nn::ParamGroup& g : root.param_groups(0.0))
    EXPECT_EQ(g.params.dtype(), g.grads.defined() ? DType::f32 : DType::bf16);
  int gathers = 0;
  for (const std::string& e : logged_step(model, root, c))
    gathers += e.rfind("ag_issue:", 0) == 0 && e.find("(frozen)") != std::string::npos;
  if (world()->size() == 1) EXPECT_EQ(gathers, 0);  // its shards are its parameters
}
// A toy packed format for the test: format 0 rows are an f32 scale and int8 values (x = s * q),
// format 1 rows the f32 values themselves. Each 2-D base weight holds its first rows in format 0
// and its last one in format 1: two row lengths in one weight, as q, k and v of other types make.
PackedRows toy_packed(const Shape& shape) {
  const int64_t rows = shape[0], row = shape_numel(shape) / rows, first = rows - 1;
  PackedRows p;
  p.runs = {{first, 4 + row, 0}, {rows - first, 4 * row, 1}};
  p.decode = [](uint32_t format, const uint8_t* src, float* dst, int64_t n) {
    if (format == 1) {
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    }
    float scale;
    std::memcpy(&scale, src, 4);
    for (int64_t i = 0; i < n; ++i) dst[i] = scale * float(int8_t(src[4 + i]));
  };
  return p;
}

// Row r of a weight in the toy format (rows of format 0 quantized to int8 with their max).
std::vector<uint8_t> toy_encode(const PackedRows& p, const float* x, int64_t r, int64_t row) {
  if (r >= p.runs[0].rows) {
    std::vector<uint8_t> out(size_t(row) * 4);
    std::memcpy(out.data(), x, out.size());
    return out;
  }
  float most = 1e-30f;
  for (int64_t i = 0; i < row; ++i) most = std::max(most, std::abs(x[i]));
  const float scale = most / 127.0f;
  std::vector<uint8_t> out(size_t(4 + row));
  std::memcpy(out.data(), &scale, 4);
  for (int64_t i = 0; i < row; ++i)
    out[size_t(4 + i)] = uint8_t(int8_t(std::lround(std::clamp(x[i] / scale, -127.0f, 127.0f))));
  return out;
}

// QLoRA's storage (FullyShardOptions::frozen_packed): a base kept packed, gathered as its bytes
// and decoded before use, trains the adapters exactly as the same base decoded first and held as
// f32 (the same values reach the same ops), at every world size; the packed groups hold fewer
// bytes, gather at more than one rank, and decode at every unshard.
TEST(Equivalence, PackedFrozenBaseTrainsAsItsDecodedValues) {
  const nn::LoraConfig lora{
      .rank = 2, .alpha = 4.0, .targets = nn::parse_lora_targets("q,k,v,o,gate,up,down")};
  // f32 and f64 runs, and a bf16 base beside f32 adapters (decoded into bf16).
  for (const auto& dtypes : {std::pair<DType, std::optional<DType>>{DType::f32, {}},
                             {DType::f64, {}},
                             {DType::f32, DType::bf16}}) {
    const DType dtype = dtypes.first;
    const std::optional<DType> frozen = dtypes.second;
    SCOPED_TRACE(
        fmt::format("{} run, {} base", dtype_name(dtype), dtype_name(frozen.value_or(dtype))));
    const struct Run run { .dtype = dtype, .lora = lora, .frozen_dtype = frozen };
    const nn::TransformerConfig c = config(run);
    std::map<std::string, Tensor> init;  // the whole initial weights in f32, every rank alike
    for (auto& [n, t] : sharded(run, false).params) init[n] = t.to(DType::f32).contiguous();
    auto packed_of = [&](const std::string& name) -> std::optional<PackedRows> {
      const Tensor& t = init.at(name);
      if (t.dim() != 2 || nn::is_lora_parameter(name)) return std::nullopt;
      return toy_packed(t.shape());
    };
    struct Out {
      std::vector<double> losses;
      std::vector<std::pair<std::string, Tensor>> adapters;
      std::vector<std::string> log;
      int64_t frozen_bytes = 0;
    };
    auto train = [&](bool packed) {
      auto mesh = dist::init_device_mesh({world()->size()});
      nn::Transformer model(c);
      FullyShardOptions fo{.init_dtype = dtype, .seed = kSeed};
      if (frozen) {
        fo.frozen_dtype = frozen;
        fo.mp_policy = {.param_dtype = frozen, .reduce_dtype = DType::f32};
      }
      if (packed) fo.frozen_packed = packed_of;
      for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers()[i], mesh, fo);
      FSDPModule& root = fully_shard(model, mesh, fo);
      std::vector<nn::ParamGroup> groups = root.param_groups(0.01);
      // The base: each rank's rows, decoded (float groups) or as their bytes (packed groups).
      for (const auto& in : root.shard_infos()) {
        auto rows = packed_of(in.name);
        if (!rows || in.local_rows == 0) continue;
        const Tensor& full = init.at(in.name);
        const int64_t row = full.shape()[1];
        auto* bytes = static_cast<uint8_t*>(groups[in.group].params.raw_data());
        std::vector<float> values(static_cast<size_t>(row));
        int64_t at = in.offset;
        for (int64_t r = in.local_begin; r < in.local_begin + in.local_rows; ++r) {
          const std::vector<uint8_t> enc = toy_encode(*rows, full.data<float>() + r * row, r, row);
          if (in.packed) {
            std::memcpy(bytes + at, enc.data(), enc.size());
            at += int64_t(enc.size());
          } else {
            rows->decode(r < rows->runs[0].rows ? 0 : 1, enc.data(), values.data(), row);
            const int64_t to = in.offset + (r - in.local_begin) * row;
            groups[in.group].params.slice(to, to + row).copy_(Tensor::from_vector(values, {row}));
          }
        }
        if (in.packed) EXPECT_EQ(at - in.offset, in.packed_bytes) << in.name;
      }
      Out o;
      for (const nn::ParamGroup& g : groups)
        if (!g.grads.defined()) o.frozen_bytes += int64_t(g.params.nbytes());
      optim::AdamW opt(groups, {.lr = 1e-2});
      o.losses = train_losses(model, root, opt, c, run);
      for (auto& [n, d] : root.sharded_parameters())
        if (nn::is_lora_parameter(n)) o.adapters.emplace_back(n, d.full_tensor());
      o.log = logged_step(model, root, c);
      return o;
    };
    const Out plain = train(false), packed = train(true);
    EXPECT_EQ(packed.losses, plain.losses);
    ASSERT_EQ(packed.adapters.size(), plain.adapters.size());
    for (size_t i = 0; i < plain.adapters.size(); ++i)
      EXPECT_EQ(packed.adapters[i].second.to_f64_vector(), plain.adapters[i].second.to_f64_vector())
          << plain.adapters[i].first;
    EXPECT_LT(packed.frozen_bytes, plain.frozen_bytes * 3 / 4);
    int decodes = 0, packed_gathers = 0;
    for (const std::string& e : packed.log) {
      decodes += e.rfind("decode:", 0) == 0;
      packed_gathers += e.rfind("ag_issue:", 0) == 0 && e.ends_with("(frozen, packed)");
    }
    EXPECT_GE(decodes, 2 * int(c.layers));  // every block's forward and backward
    EXPECT_EQ(packed_gathers > 0, world()->size() > 1);
  }
}
TEST(Equivalence, Hsdp2x2) {
  if (world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_equivalent({.hsdp = 2}, 1e-10, 1e-10);
}
// bf16 parameters round every weight to 8 bits of mantissa before use; the
// losses then follow the f64 run to about 1e-2.
TEST(Equivalence, Bf16ParamDtypeIsClose) {
  expect_equivalent({.dtype = DType::f32, .param_dtype = DType::bf16}, 2e-2, 5e-2);
}

// At one rank with bf16 parameters (another compute dtype than the master's), the shards are cast
// straight into bf16 and the gradients added straight into them: no all-gather, no
// reduce-scatter, no copies around them, and the same losses and parameters bit for bit as the
// collectives' path (FSDP_ONE_RANK_CAST=0), with gradient accumulation too.
TEST(OneRank, CastStraightIntoTheComputeDtypeIsBitIdenticalToTheCollectivesPath) {
  if (world()->size() != 1) GTEST_SKIP() << "a one-rank shortcut";
  for (int64_t accum : {1, 2}) {
    const struct Run run{.dtype = DType::f32, .accum = accum, .param_dtype = DType::bf16};
    ::setenv("FSDP_ONE_RANK_CAST", "0", 1);
    const Result collectives = sharded(run);
    ::setenv("FSDP_ONE_RANK_CAST", "1", 1);
    const Result cast = sharded(run);
    ASSERT_EQ(cast.losses, collectives.losses) << "accum " << accum;
    for (size_t i = 0; i < cast.params.size(); ++i)
      EXPECT_EQ(cast.params[i].second.to_f64_vector(), collectives.params[i].second.to_f64_vector())
          << cast.params[i].first;
  }
  // The event log of a step: casts, no collective and no gradient add (the reduce dtype is the
  // master's: the layers add straight into the shard's gradients).
  nn::TransformerConfig c = config(nn::Arch::decoder);
  auto mesh = dist::init_device_mesh({1});
  nn::Transformer model(c);
  FullyShardOptions fo{.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = DType::f32},
                       .init_dtype = DType::f32,
                       .seed = kSeed};
  for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers()[i], mesh, fo);
  FSDPModule& root = fully_shard(model, mesh, fo);
  const std::vector<std::string> log = logged_step(model, root, c);
  int casts = 0, adds = 0;
  for (const std::string& e : log) {
    EXPECT_EQ(e.rfind("ag_", 0), std::string::npos) << e;
    EXPECT_EQ(e.rfind("rs_", 0), std::string::npos) << e;
    casts += e.rfind("cast:", 0) == 0;
    adds += e.rfind("grad_add:", 0) == 0;
  }
  EXPECT_GE(casts, int(model.layers().size()) + 1);
  EXPECT_EQ(adds, 0);
}

TEST(Sharding, SameSeedSameModelAtAnyWorldSize) {
  nn::TransformerConfig c = config(nn::Arch::decoder);
  nn::Transformer plain(c);
  nn::materialize(plain, DType::f64, kSeed);
  nn::Transformer model(c);
  auto mesh = dist::init_device_mesh({world()->size()});
  for (size_t i = 0; i < model.layers().size(); ++i)
    fully_shard(model.layers()[i], mesh, {.init_dtype = DType::f64, .seed = kSeed});
  FSDPModule& root = fully_shard(model, mesh, {.init_dtype = DType::f64, .seed = kSeed});
  for (auto& [n, d] : root.sharded_parameters()) {
    EXPECT_EQ(d.full_tensor().to_f64_vector(), plain.parameter(n).data.to_f64_vector()) << n;
    EXPECT_TRUE(dist::is_shard(d.placements()[0], 0));
    auto [b, len] = dist::chunk_range(d.shape()[0], world()->size(), world()->rank());
    EXPECT_EQ(d.to_local().size(0), len) << n;
  }
}

// Bytes a rank holds for parameters, gradients and AdamW's two moments: each
// parameter's dim 0 chunked over the ranks and padded to the largest chunk.
int64_t formula_bytes(nn::Transformer& m, int64_t N, DType dt) {
  int64_t elems = 0;
  for (auto& [n, p] : m.named_parameters())
    elems += dist::chunk_size(p->shape[0], N) * (shape_numel(p->shape) / p->shape[0]);
  return 4 * elems * int64_t(dtype_size(dt));
}

nn::TransformerConfig memory_config() {
  nn::TransformerConfig c = config(nn::Arch::decoder);
  c.vocab = 64;
  c.dim = 64;
  c.heads = 4;
  c.layers = 8;
  c.ffn_hidden = 256;
  c.seq = 8;
  return c;
}

int64_t step_peak(nn::Transformer& model, FSDPModule* root, const Tensor& flat_grads,
                  optim::AdamW& opt, int64_t B) {
  const auto& c = model.config();
  data::RandomTokenSource src(c.vocab, kSeed);
  auto b = src.batch(0, B, 0, B, c.seq);
  allocator_for(Device::cpu()).reset_peak();
  if (root)
    root->zero_grad();
  else
    flat_grads.zero_();
  Tensor logits = model.forward(b.inputs).view({B * c.seq, c.vocab});
  auto x = ops::cross_entropy_forward(logits, b.targets);
  Tensor d = ops::cross_entropy_backward(logits, b.targets, x.lse).view({B, c.seq, c.vocab});
  logits = Tensor();
  model.backward(d);
  d = Tensor();
  opt.step();
  return memory_stats().peak;
}

TEST(Memory, PersistentBytesFollowTheFormulaAndPeakDrops) {
  const int N = world()->size();
  const int64_t B = 2;
  nn::TransformerConfig c = memory_config();
  int64_t plain_persistent = 0, plain_peak = 0;
  {
    nn::Transformer plain(c);
    const int64_t before = memory_stats().current;
    auto flat = nn::materialize(plain, DType::f32, kSeed);
    optim::AdamW opt({{flat.params, flat.grads, 0.01}}, {.lr = 1e-3});
    plain_persistent = memory_stats().current - before;
    EXPECT_EQ(plain_persistent, formula_bytes(plain, 1, DType::f32));
    plain_peak = step_peak(plain, nullptr, flat.grads, opt, B) - before;
  }
  auto mesh = dist::init_device_mesh({N});
  nn::Transformer model(c);
  const int64_t before = memory_stats().current;
  for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers()[i], mesh);
  FSDPModule& root = fully_shard(model, mesh);
  optim::AdamW opt(root.param_groups(0.01), {.lr = 1e-3});
  const int64_t persistent = memory_stats().current - before;
  EXPECT_EQ(persistent, formula_bytes(model, N, DType::f32)) << "rank " << world()->rank();
  const int64_t peak = step_peak(model, &root, Tensor(), opt, B) - before;
  EXPECT_EQ(memory_stats().current - before, persistent) << "unsharded buffers outlived the step";
  if (N == 4) {
    const int64_t saved = plain_persistent - persistent;
    EXPECT_GE(plain_peak - peak, int64_t(0.6 * double(saved)))
        << "peak " << peak << " vs unsharded " << plain_peak << ", persistent saved " << saved;
  }
}

TEST(Memory, ReshardReturnsTheUnshardedBytes) {
  auto mesh = dist::init_device_mesh({world()->size()});
  nn::Transformer model(memory_config());
  FSDPModule& block = fully_shard(model.layers()[0], mesh);
  fully_shard(model, mesh);
  const int64_t before = memory_stats().current;
  block.unshard();
  const int64_t unsharded = memory_stats().current - before;
  if (world()->size() > 1) EXPECT_GT(unsharded, 0);
  block.reshard();
  EXPECT_EQ(memory_stats().current, before);
  auto handle = block.unshard(/*async=*/true);
  handle->wait();
  EXPECT_TRUE(model.parameter("layers.0.attn.in_proj_weight").data.defined());
  block.reshard();
  EXPECT_FALSE(model.parameter("layers.0.attn.in_proj_weight").data.defined());
}

int index_of(const std::vector<std::string>& log, const std::string& ev, int from = 0) {
  for (int i = from; i < int(log.size()); ++i)
    if (log[size_t(i)] == ev) return i;
  return -1;
}

// Activation checkpointing changes no number: full and every:2 give bit-identical losses and
// parameters to the same sharded run without it, in f64 and f32, with gradient accumulation too.
TEST(ActivationCheckpoint, FullAndEveryTwoAreBitIdentical) {
  for (DType t : {DType::f64, DType::f32})
    for (int64_t accum : {1, 2}) {
      const Result plain = sharded({.dtype = t, .accum = accum});
      for (int64_t every : {1, 2}) {
        const Result ac = sharded({.dtype = t, .accum = accum, .ac_every = every});
        const std::string at = fmt::format("{} accum {} every {}", dtype_name(t), accum, every);
        ASSERT_EQ(ac.losses, plain.losses) << at;
        ASSERT_EQ(ac.params.size(), plain.params.size());
        for (size_t i = 0; i < plain.params.size(); ++i)
          EXPECT_EQ(ac.params[i].second.to_f64_vector(), plain.params[i].second.to_f64_vector())
              << at << " " << plain.params[i].first;
      }
    }
}

// The recompute uses the parameters that the pre-backward hook gathered: exactly one all-gather
// per block in the backward, checkpointed or not (FSDP2 has gathered twice, pytorch #105635).
TEST(ActivationCheckpoint, OneAllGatherPerBlockInTheBackward) {
  if (world()->size() < 2) GTEST_SKIP() << "one rank uses its shards in place: no all-gather";
  nn::TransformerConfig c = config(nn::Arch::decoder);
  auto mesh = dist::init_device_mesh({world()->size()});
  nn::Transformer model(c);
  for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers()[i], mesh);
  FSDPModule& root = fully_shard(model, mesh);
  for (size_t i = 0; i < model.layers().size(); ++i)
    model.layers()[i].set_activation_checkpoint(true);
  data::RandomTokenSource src(c.vocab, kSeed);
  for (int step = 0; step < 2; ++step) {
    root.set_event_log(true);
    auto b = src.batch(step, 2, 0, 2, c.seq);
    Tensor logits = model.forward(b.inputs).view({2 * c.seq, c.vocab});
    auto x = ops::cross_entropy_forward(logits, b.targets);
    model.backward(ops::cross_entropy_backward(logits, b.targets, x.lse).view({2, c.seq, c.vocab}));
    auto log = root.take_event_log();
    root.set_event_log(false);
    const int backward_from = index_of(log, "fwd_end:<root>");
    ASSERT_GE(backward_from, 0);
    for (int64_t i = 0; i < c.layers; ++i) {
      const std::string ag = fmt::format("ag_issue:layers.{}", i);
      int n = 0;
      for (size_t k = size_t(backward_from); k < log.size(); ++k) n += log[k] == ag ? 1 : 0;
      EXPECT_EQ(n, 1) << "step " << step << ": all-gathers of block " << i << " in the backward";
    }
  }
}

// A forward hook inside the module's own backward (a recompute through forward()) is refused,
// naming the module and both states.
TEST(ActivationCheckpoint, AForwardInsideItsOwnBackwardIsNamed) {
  nn::TransformerConfig c = config(nn::Arch::decoder);
  auto mesh = dist::init_device_mesh({world()->size()});
  nn::Transformer model(c);
  FSDPModule& block = fully_shard(model.layers()[0], mesh);
  fully_shard(model, mesh);
  Tensor x = Tensor::zeros({1, c.seq, c.dim}, DType::f32);
  (void)model.layers()[0].forward(x);
  block.state().pre_backward();
  try {
    (void)model.layers()[0].forward(x);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'layers.0': pre-forward hook in state pre_backward"), std::string::npos) << m;
  }
}

TEST(Overlap, PrefetchAndReduceScatterByOrderOfEvents) {
  if (world()->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  nn::TransformerConfig c = config(nn::Arch::decoder);
  auto mesh = dist::init_device_mesh({world()->size()});
  nn::Transformer model(c);
  for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers()[i], mesh);
  FSDPModule& root = fully_shard(model, mesh);
  data::RandomTokenSource src(c.vocab, kSeed);
  for (int step = 0; step < 2;
       ++step) {  // the first step uses the tree order, the second the recorded one
    root.set_event_log(true);
    auto b = src.batch(step, 2, 0, 2, c.seq);
    Tensor logits = model.forward(b.inputs).view({2 * c.seq, c.vocab});
    auto x = ops::cross_entropy_forward(logits, b.targets);
    model.backward(ops::cross_entropy_backward(logits, b.targets, x.lse).view({2, c.seq, c.vocab}));
    auto log = root.take_event_log();
    root.set_event_log(false);
    for (int64_t i = 0; i + 1 < c.layers; ++i) {
      // Forward: block i+1's all-gather is issued before block i's compute ends.
      const int issue = index_of(log, fmt::format("ag_issue:layers.{}", i + 1));
      const int end = index_of(log, fmt::format("fwd_end:layers.{}", i));
      EXPECT_GE(issue, 0);
      EXPECT_LT(issue, end) << "step " << step << " block " << i;
    }
    for (int64_t i = 1; i < c.layers; ++i) {
      // Backward: block i's reduce-scatter is issued before block i-1 computes
      // and nobody waits for it until block i-1 has finished.
      const int rs = index_of(log, fmt::format("rs_issue:layers.{}", i));
      const int begin = index_of(log, fmt::format("bwd_begin:layers.{}", i - 1));
      const int end = index_of(log, fmt::format("bwd_end:layers.{}", i - 1));
      const int wait = index_of(log, fmt::format("rs_wait:layers.{}", i));
      EXPECT_TRUE(rs >= 0 && rs < begin && begin < end && end < wait)
          << "step " << step << " block " << i;
    }
    // Backward prefetch: block i-1 is gathered before block i's backward begins.
    for (int64_t i = 1; i < c.layers; ++i) {
      const int bwd_issue =
          index_of(log, fmt::format("ag_issue:layers.{}", i - 1), index_of(log, "fwd_end:<root>"));
      EXPECT_LT(bwd_issue, index_of(log, fmt::format("bwd_begin:layers.{}", i))) << "block " << i;
    }
  }
  (void)root;
}

TEST(Clip, GlobalNormAcrossShardsEqualsTheUnshardedNorm) {
  nn::TransformerConfig c = config(nn::Arch::decoder);
  const int N = world()->size(), me = world()->rank();
  nn::Transformer plain(c);
  auto flat = nn::materialize(plain, DType::f64, kSeed);
  data::RandomTokenSource src(c.vocab, kSeed);
  auto b = src.batch(0, kGlobalRows, 0, kGlobalRows, c.seq);
  Tensor logits = plain.forward(b.inputs).view({kGlobalRows * c.seq, c.vocab});
  auto x = ops::cross_entropy_forward(logits, b.targets);
  plain.backward(
      ops::cross_entropy_backward(logits, b.targets, x.lse).view({kGlobalRows, c.seq, c.vocab}));
  const double ref = optim::clip_grad_norm({{flat.params, flat.grads, 0}}, 0, nullptr);

  auto mesh = dist::init_device_mesh({N});
  nn::Transformer model(c);
  for (size_t i = 0; i < model.layers().size(); ++i)
    fully_shard(model.layers()[i], mesh, {.init_dtype = DType::f64, .seed = kSeed});
  FSDPModule& root = fully_shard(model, mesh, {.init_dtype = DType::f64, .seed = kSeed});
  const int64_t B = kGlobalRows / N;
  auto mb = src.batch(0, kGlobalRows, me * B, B, c.seq);
  Tensor l2 = model.forward(mb.inputs).view({B * c.seq, c.vocab});
  auto x2 = ops::cross_entropy_forward(l2, mb.targets);
  model.backward(ops::cross_entropy_backward(l2, mb.targets, x2.lse).view({B, c.seq, c.vocab}));
  auto groups = root.param_groups(0);
  const double norm = optim::clip_grad_norm(groups, ref / 2, mesh->group(0));
  EXPECT_NEAR(norm, ref, 1e-10 * ref);
  EXPECT_NEAR(optim::clip_grad_norm(groups, 0, mesh->group(0)), ref / 2,
              1e-6 * ref);                                           // clipped to half
  EXPECT_NEAR(optim::clip_grad_norm(root, 0), ref / 2, 1e-6 * ref);  // the group from the module
}

// model.zero_grad() on a sharded model clears the sharded gradients (it used to compile and
// leave them, so a second backward doubled the grad norm); inside a sharded module it refuses.
TEST(ZeroGrad, ModuleZeroGradClearsShardedGradientsOrRefuses) {
  nn::TransformerConfig c = config(nn::Arch::decoder);
  const int N = world()->size(), me = world()->rank();
  auto mesh = dist::init_device_mesh({N});
  nn::Transformer model(c);
  for (size_t i = 0; i < model.layers().size(); ++i)
    fully_shard(model.layers()[i], mesh, {.init_dtype = DType::f64, .seed = kSeed});
  FSDPModule& root = fully_shard(model, mesh, {.init_dtype = DType::f64, .seed = kSeed});
  data::RandomTokenSource src(c.vocab, kSeed);
  const int64_t B = kGlobalRows / N;
  auto mb = src.batch(0, kGlobalRows, me * B, B, c.seq);
  auto step = [&] {
    Tensor l = model.forward(mb.inputs).view({B * c.seq, c.vocab});
    auto x = ops::cross_entropy_forward(l, mb.targets);
    model.backward(ops::cross_entropy_backward(l, mb.targets, x.lse).view({B, c.seq, c.vocab}));
    return optim::clip_grad_norm(root.param_groups(0), 0, mesh->group(0));
  };
  const double once = step();
  model.zero_grad();
  EXPECT_NEAR(step(), once, 1e-12 * once) << "model.zero_grad() left the sharded gradients";
  model.layers()[0].zero_grad();  // a sharded module itself: clears its own group
  try {
    model.layers()[0].named_children().front().second->zero_grad();
    FAIL() << "zero_grad() inside a sharded module did not refuse";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FSDPModule::zero_grad"), std::string::npos) << e.what();
  }
}

// Blocks sharded on their own, under no sharded root: each is a root of its own backward. A step
// that skips one block (its forward never runs) leaves that block's gradients zero after
// zero_grad, not the last step's (zero_grad's lazy zeroing is settled when the gradients are read).
TEST(ZeroGrad, ABlockTheStepSkipsReadsZerosWithNoShardedRoot) {
  auto mesh = dist::init_device_mesh({world()->size()});
  const FullyShardOptions opt{.init_dtype = DType::f64, .seed = kSeed};
  nn::Linear a(6, 6, true), b(6, 6, true);
  FSDPModule& sa = fully_shard(a, mesh, opt);
  FSDPModule& sb = fully_shard(b, mesh, opt);
  const Tensor x = test::random_tensor({4, 6}, 3, DType::f64);
  const Tensor dy = test::random_tensor({4, 6}, 4, DType::f64);
  auto norm = [&](FSDPModule& s) {
    return optim::clip_grad_norm(s.param_groups(0), 0, mesh->group(0));
  };
  // Step 1: both blocks.
  sa.zero_grad(), sb.zero_grad();
  b.forward(a.forward(x));
  a.backward(b.backward(dy));
  const double first_a = norm(sa);
  EXPECT_GT(norm(sb), 0.0);
  // Step 2: b is skipped; a's gradient is step 2's alone, b's zero.
  sa.zero_grad(), sb.zero_grad();
  a.forward(x);
  a.backward(dy);
  EXPECT_GT(norm(sa), 0.0);
  EXPECT_NE(norm(sa), first_a);
  EXPECT_EQ(norm(sb), 0.0) << "a block the step skipped kept the last step's gradients";
  for (const nn::ParamGroup& g : sb.param_groups(0))
    for (double v : g.grads.to_f64_vector()) EXPECT_EQ(v, 0.0);
}

// ---------------------------------------------------------------- a user's hooks beside
// fully_shard

// A user's link in a sharded block's chain: logs each call with the block's FSDP state at that
// moment (which says whether fully_shard's link ran before it), records the input gradient it
// receives, and returns it times `scale`.
class UserHooks : public nn::ModuleHooks {
 public:
  UserHooks(std::string name, std::vector<std::string>* log, double scale = 1)
      : name_(std::move(name)), log_(log), scale_(scale) {}
  Tensor pre_forward(nn::Module& m, const Tensor& x) override { return note(m, "pre_forward", x); }
  Tensor post_forward(nn::Module& m, const Tensor& y) override {
    return note(m, "post_forward", y);
  }
  Tensor pre_backward(nn::Module& m, const Tensor& dy) override {
    return note(m, "pre_backward", dy);
  }
  Tensor post_backward(nn::Module& m, const Tensor& dx) override {
    note(m, "post_backward", dx);
    seen_dx.push_back(dx);
    if (scale_ == 1) return dx;
    Tensor out = dx.clone();
    ops::scale_(out, scale_);
    return out;
  }
  std::vector<Tensor> seen_dx;

 private:
  Tensor note(nn::Module& m, const char* what, const Tensor& t) {
    log_->push_back(fmt::format("{}.{}:{}", name_, what,
                                training_state_name(fsdp_state(m)->state().training_state)));
    return t;
  }
  std::string name_;
  std::vector<std::string>* log_;
  double scale_;
};

// This rank's shard of each parameter's gradient, by name.
std::map<std::string, std::vector<double>> local_grads(FSDPModule& root) {
  const std::vector<nn::ParamGroup> groups = root.param_groups(0);
  std::map<std::string, std::vector<double>> out;
  for (const FSDPModule::ShardInfo& s : root.shard_infos()) {
    const int64_t row = shape_numel(s.global_shape) / s.global_shape[0];
    out[s.name] =
        groups[s.group].grads.slice(s.offset, s.offset + s.local_rows * row).to_f64_vector();
  }
  return out;
}

// A user's hooks on a fully_shard'ed block (layers.1), one installed before fully_shard ("early")
// and one after it ("late"), at every world size, with and without activation checkpointing of
// the block:
// - they run in the documented order around fully_shard's link: forward in registration order,
//   backward in reverse (the late link's pre-backward before fully_shard's all-gather, its
//   post-backward before the reduce-scatter);
// - the late link sees the block's input gradient (the same tensor values as in the unscaled run)
//   and returns it times 2: the gradients of everything before the block (embed, layers.0) are
//   the unscaled run's times 2 exactly, every other gradient equals the unscaled run's bit for bit;
// - removed, the links no longer run, and the next step's gradients are the unscaled run's.
TEST(Hooks, AUserHookOnAShardedBlockSeesAndScalesItsInputGradient) {
  const nn::TransformerConfig c = config(nn::Arch::decoder);
  const int N = world()->size(), me = world()->rank();
  const int64_t B = kGlobalRows / N;
  data::RandomTokenSource src(c.vocab, kSeed);
  const data::Batch mb = src.batch(0, kGlobalRows, me * B, B, c.seq);
  struct Out {
    std::map<std::string, std::vector<double>> grads, grads_after_removal;
    std::vector<std::string> log;
    size_t log_after_removal = 0;
    std::vector<Tensor> seen_dx;
  };
  auto run = [&](double scale, bool ac) {
    Out out;
    auto mesh = dist::init_device_mesh({N});
    nn::Transformer model(c);
    nn::Module& block = model.layers()[1];
    auto early = std::make_shared<UserHooks>("early", &out.log);
    nn::HookHandle early_handle = block.add_hooks(early);
    for (size_t i = 0; i < model.layers().size(); ++i)
      fully_shard(model.layers()[i], mesh, {.init_dtype = DType::f32, .seed = kSeed});
    FSDPModule& root = fully_shard(model, mesh, {.init_dtype = DType::f32, .seed = kSeed});
    auto late = std::make_shared<UserHooks>("late", &out.log, scale);
    nn::HookHandle late_handle = block.add_hooks(late);
    block.set_activation_checkpoint(ac);
    auto step = [&] {
      root.zero_grad();
      Tensor l = model.forward(mb.inputs).view({B * c.seq, c.vocab});
      auto x = ops::cross_entropy_forward(l, mb.targets);
      model.backward(ops::cross_entropy_backward(l, mb.targets, x.lse).view({B, c.seq, c.vocab}));
      return local_grads(root);
    };
    out.grads = step();
    out.seen_dx = late->seen_dx;
    early_handle.remove();
    late_handle.remove();
    const size_t logged = out.log.size();
    out.grads_after_removal = step();
    out.log_after_removal = out.log.size() - logged;
    return out;
  };
  for (bool ac : {false, true}) {
    const std::string at = fmt::format("activation checkpoint {}", ac);
    const Out plain = run(1, ac), scaled = run(2, ac);
    EXPECT_EQ(scaled.log, (std::vector<std::string>{
                              "early.pre_forward:idle", "late.pre_forward:forward",
                              "early.post_forward:forward", "late.post_forward:idle",
                              "late.pre_backward:idle", "early.pre_backward:pre_backward",
                              "late.post_backward:pre_backward", "early.post_backward:idle"}))
        << at;
    ASSERT_EQ(scaled.seen_dx.size(), 1u) << at;
    ASSERT_EQ(plain.seen_dx.size(), 1u) << at;
    EXPECT_EQ(scaled.seen_dx[0].shape(), Shape({B, c.seq, c.dim})) << at;
    EXPECT_EQ(scaled.seen_dx[0].to_f64_vector(), plain.seen_dx[0].to_f64_vector()) << at;
    ASSERT_EQ(scaled.grads.size(), plain.grads.size());
    int scaled_params = 0;
    for (const auto& [name, g] : plain.grads) {
      const bool before_block = name == "embed.weight" || name.rfind("layers.0.", 0) == 0;
      std::vector<double> want = g;
      if (before_block) {
        for (double& v : want) v *= 2;
        ++scaled_params;
      }
      EXPECT_EQ(scaled.grads.at(name), want) << at << ": " << name;
      EXPECT_EQ(scaled.grads_after_removal.at(name), g) << at << ": " << name << " after removal";
    }
    EXPECT_GT(scaled_params, 1) << at;
    EXPECT_EQ(scaled.log_after_removal, 0u) << at << ": a removed link ran";
  }
}

// A module with a 0-dim parameter.
class Scalar : public nn::Module {
 public:
  Scalar() : Module("Scalar") { register_parameter("scale", {}, nn::Init::constant(1)); }

 protected:
  Tensor forward_impl(const Tensor& x) override { return x; }
  Tensor backward_impl(const Tensor& dy) override { return dy; }
};

TEST(BadInput, ShardingTwiceZeroDimAndShapesThatDiffer) {
  auto mesh = dist::init_device_mesh({world()->size()});
  {
    nn::Transformer model(config(nn::Arch::decoder));
    std::vector<std::string> log;
    model.layers()[0].add_hooks(std::make_shared<UserHooks>("user", &log));  // no obstacle
    fully_shard(model.layers()[0], mesh);
    try {
      fully_shard(model.layers()[0], mesh);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("TransformerBlock 'layers.0' is already sharded"),
                std::string::npos)
          << e.what();
    }
  }
  {
    Scalar s;
    try {
      fully_shard(s, mesh);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("parameter 'scale' is 0-dim"), std::string::npos)
          << e.what();
    }
  }
  if (world()->size() < 2) return;
  nn::TransformerConfig c = config(nn::Arch::decoder);
  if (world()->rank() == 1) c.ffn_hidden += 1;  // this rank's FFN weights differ
  nn::Transformer model(c);
  for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers()[i], mesh);
  fully_shard(model, mesh);
  data::RandomTokenSource src(c.vocab, kSeed);
  auto b = src.batch(0, 1, 0, 1, c.seq);
  try {
    model.forward(b.inputs);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'layers.0.ffn.w1.weight' has shape"),
              std::string::npos)
        << e.what();
  }
}

TEST(BadInput, ParameterOnAnotherDeviceThanTheMesh) {
  if (!cuda_available())
    GTEST_SKIP() << "no CUDA device (needs a parameter on cuda:0 and a CPU mesh)";
  auto mesh = dist::init_device_mesh({world()->size()});
  nn::Transformer model(config(nn::Arch::decoder));
  nn::materialize(model, DType::f32, kSeed, Device::cuda(0));
  try {
    fully_shard(model, mesh);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is on cuda:0 but the mesh is on cpu"), std::string::npos)
        << e.what();
  }
}

// A module that applies one Linear twice (shared weights).
class LinearTwice : public nn::Module {
 public:
  LinearTwice() : Module("LinearTwice") {
    lin_ = &register_module("lin", std::make_unique<nn::Linear>(6, 6, true));
  }
  nn::Linear& lin() { return *lin_; }

 protected:
  Tensor forward_impl(const Tensor& x) override { return lin_->forward(lin_->forward(x)); }
  Tensor backward_impl(const Tensor& dy) override { return lin_->backward(lin_->backward(dy)); }

 private:
  nn::Linear* lin_;
};

// A module called twice in one forward, as FSDP2 takes it: sharded on its own (and its parent),
// it is all-gathered for each call, both backwards add into one unsharded gradient and it is
// reduced once, after its last backward; checkpointed too; or only its parent sharded. Every
// rank's shard of each gradient (the sum over both uses) equals those rows of the unsharded
// model's in f64, and the forward equals it exactly.
TEST(ReusedModule, AShardedModuleCalledTwiceIsReducedOnceWithBothUsesGradients) {
  auto mesh = dist::init_device_mesh({world()->size()});
  const Tensor x = test::random_tensor({4, 6}, 3, DType::f64);
  const Tensor dy = test::random_tensor({4, 6}, 4, DType::f64);
  LinearTwice ref;
  auto flat = nn::materialize(ref, DType::f64, kSeed);
  flat.grads.zero_();
  const Tensor y_ref = ref.forward(x);
  ref.backward(dy);
  const FullyShardOptions opt{.init_dtype = DType::f64, .seed = kSeed};
  for (const char* mode : {"root only", "lin and root", "lin checkpointed"}) {
    SCOPED_TRACE(mode);
    const bool lin_sharded = std::string(mode) != "root only";
    LinearTwice m;
    if (lin_sharded) fully_shard(m.lin(), mesh, opt);
    if (std::string(mode) == "lin checkpointed") m.lin().set_activation_checkpoint(true);
    FSDPModule& root = fully_shard(m, mesh, opt);
    root.set_event_log(true);
    for (int step = 0; step < 2; ++step) {  // the second step: nothing left over from the first
      root.zero_grad();
      EXPECT_EQ(m.forward(x).to_f64_vector(), y_ref.to_f64_vector());
      m.backward(dy);
      const auto grads = local_grads(root);
      for (const FSDPModule::ShardInfo& s : root.shard_infos()) {
        const Tensor& g = ref.parameter(s.name).grad;
        const int64_t row = g.numel() / g.size(0);
        const std::vector<double> want =
            g.view({-1})
                .slice(s.local_begin * row, (s.local_begin + s.local_rows) * row)
                .to_f64_vector();
        ASSERT_EQ(grads.at(s.name).size(), want.size()) << s.name;
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(grads.at(s.name)[i], want[i], 1e-12 * (1 + std::abs(want[i])))
              << s.name << " " << i;
      }
      int reduced = 0, gathered = 0;
      for (const std::string& e : root.take_event_log()) {
        reduced += e == "rs_issue:lin" || e == "grad_add:lin";
        gathered += e == "ag_issue:lin";
      }
      if (world()->size() > 1) {  // (one rank's parameters and gradients are the shards)
        EXPECT_EQ(reduced, lin_sharded ? 1 : 0);
        EXPECT_EQ(gathered, lin_sharded ? 4 : 0);  // for 2 calls and 2 backwards
      }
    }
  }
  LinearTwice m;
  fully_shard(m, mesh, opt);
  const nn::BatchContextScope mb(m, {.microbatch = 1});
  const std::string e = test::error_of([&] { m.forward(x); });
  EXPECT_NE(e.find("[fully_shard] '<root>': forward of microbatch 1"), std::string::npos) << e;
}

// A module that also calls its Linear for an output it does not train through (a probe): that
// call's record is never popped. Under fully_shard its records would hold the Linear's gradients
// back from their reduce-scatter, so the root's post-backward refuses the step by name instead of
// letting the optimizer read gradients that were never reduced.
class LinearProbed : public nn::Module {
 public:
  LinearProbed() : Module("LinearProbed") {
    lin_ = &register_module("lin", std::make_unique<nn::Linear>(6, 6, true));
  }
  nn::Linear& lin() { return *lin_; }

 protected:
  Tensor forward_impl(const Tensor& x) override {
    (void)lin_->forward(x);  // the probe: no backward will pop its record
    return lin_->forward(x);
  }
  Tensor backward_impl(const Tensor& dy) override { return lin_->backward(dy); }

 private:
  nn::Linear* lin_;
};

TEST(ReusedModule, AForwardWhoseBackwardNeverRunsIsRefusedNotLeftUnreduced) {
  auto mesh = dist::init_device_mesh({world()->size()});
  const Tensor x = test::random_tensor({4, 6}, 3, DType::f64);
  const Tensor dy = test::random_tensor({4, 6}, 4, DType::f64);
  const FullyShardOptions opt{.init_dtype = DType::f64, .seed = kSeed};
  LinearProbed m;
  fully_shard(m.lin(), mesh, opt);
  FSDPModule& root = fully_shard(m, mesh, opt);
  root.zero_grad();
  m.forward(x);
  const std::string e = test::error_of([&] { m.backward(dy); });
  EXPECT_NE(e.find("left saved records whose backward never ran this step"), std::string::npos)
      << e;
}

// Linear layers of odd sizes with biases: packed one after another, most of their parameters
// would start at odd offsets. backward records where each parameter and gradient lives while the
// group has them unsharded.
class OddLinears : public nn::Module {
 public:
  OddLinears() : Module("OddLinears") {
    a_ = &register_module("a", std::make_unique<nn::Linear>(7, 13, true));
    b_ = &register_module("b", std::make_unique<nn::Linear>(13, 7, true));
    c_ = &register_module("c", std::make_unique<nn::Linear>(7, 3, true));
  }
  std::vector<std::pair<std::string, const void*>> seen;

 protected:
  Tensor forward_impl(const Tensor& x) override { return c_->forward(b_->forward(a_->forward(x))); }
  Tensor backward_impl(const Tensor& dy) override {
    for (auto& [n, p] : named_parameters()) {
      seen.emplace_back(n, p->data.raw_data());
      seen.emplace_back(n + ".grad", p->grad.raw_data());
    }
    return a_->backward(b_->backward(c_->backward(dy)));
  }

 private:
  nn::Linear *a_, *b_, *c_;
};

void expect_aligned(const std::vector<std::pair<std::string, const void*>>& seen,
                    const std::string& what) {
  for (auto& [n, ptr] : seen)
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ptr) % 16, 0u)
        << what << ": " << n << " at " << ptr << " is not 16-byte aligned (rank " << world()->rank()
        << " of " << world()->size() << ")";
}

// cuBLASLt's fast kernels and its bias epilogue need 16-byte-aligned operands: every unsharded
// parameter (weights and biases) and gradient starts 16-byte aligned, whatever the sizes before it,
// at every world size, in f32 (at one rank the shard itself is the parameter) and in bf16.
// Expert parallel's option (the trainer's experts over dp_shard_mod_ep): a divide factor in
// place of the shard group's mean, applied even at one rank; and parameters that are rows of a
// bigger global tensor (a placement's Shard(0) on another mesh dim), which shard_infos() reports
// at their global rows.
TEST(Options, GradientDivideFactorAndGlobalRows) {
  const int N = world()->size(), me = world()->rank();
  auto mesh = dist::init_device_mesh({N});
  nn::Linear mean(6, 5, false), halved(6, 5, false), placed(6, 5, false);
  fully_shard(mean, mesh, {.init_dtype = DType::f64, .seed = kSeed});
  FSDPModule& h = fully_shard(
      halved, mesh, {.init_dtype = DType::f64, .seed = kSeed, .gradient_divide_factor = 2.0 * N});
  // Rank r holds rows [5r, 5r + 5) of a [5N, 6] weight, Shard(0) on "ep"; fully_shard shards
  // them over "dp", a dim of one rank here, so each rank keeps its five rows.
  auto mesh2 = dist::init_device_mesh({1, N}, {"dp", "ep"});
  dist::from_local_parameter(placed.weight(), mesh2, {dist::Replicate{}, dist::Shard{0}},
                             {5 * N, 6}, "weight");
  FSDPModule& pl = fully_shard(placed, (*mesh2)["dp"], {.init_dtype = DType::f64, .seed = kSeed});
  const Tensor x = test::random_tensor({4, 6}, 11, DType::f64);  // the same rows on every rank
  for (nn::Linear* m : {&mean, &halved}) m->backward(Tensor::full(m->forward(x).shape(), 1.0, DType::f64));
  const std::vector<double> g = fsdp_state(mean)->param_groups(0)[0].grads.to_f64_vector();
  const std::vector<double> gh = h.param_groups(0)[0].grads.to_f64_vector();
  ASSERT_EQ(g.size(), gh.size());
  double most = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(gh[i], 0.5 * g[i], 1e-14 * (1 + std::abs(g[i]))) << i;  // the sum over 2N ranks
    most = std::max(most, std::abs(g[i]));
  }
  if (!g.empty() && dist::chunk_range(5, N, me).second > 0) EXPECT_GT(most, 0.0);
  const auto infos = pl.shard_infos();
  ASSERT_EQ(infos.size(), 1u);
  EXPECT_EQ(infos[0].global_shape, (Shape{5 * N, 6}));
  EXPECT_EQ(infos[0].local_begin, 5 * me);
  EXPECT_EQ(infos[0].local_rows, 5);
  EXPECT_EQ(infos[0].fsdp_dim, 0);
  // fully_shard's Shard(0) on dp chunks what ep's left: strided over ep's N pieces
  EXPECT_EQ(infos[0].placements, (std::vector<dist::Placement>{
                                     dist::Shard{.dim = 0, .split_factor = N}, dist::Shard{0}}));
  // Its values are the global tensor's rows: those a whole [5N, 6] parameter holds there.
  nn::Linear whole(6, 5 * N, false);
  nn::materialize(whole, DType::f64, kSeed);
  EXPECT_EQ(pl.param_groups(0)[0].params.to_f64_vector(),
            whole.weight().data.narrow(0, 5 * me, 5).contiguous().reshape({-1}).to_f64_vector());
  const auto plain = fsdp_state(mean)->shard_infos();
  EXPECT_EQ(plain[0].global_shape, (Shape{5, 6}));
  const auto [begin, rows] = dist::chunk_range(5, N, me);
  EXPECT_EQ(plain[0].local_begin, begin);
  EXPECT_EQ(plain[0].local_rows, rows);
  EXPECT_EQ(plain[0].placements, (std::vector<dist::Placement>{dist::Shard{0}}));
}

TEST(Layout, UnshardedParametersAndGradientsAre16ByteAligned) {
  auto mesh = dist::init_device_mesh({world()->size()});
  for (std::optional<DType> pd : {std::optional<DType>(), std::optional<DType>(DType::bf16)}) {
    OddLinears m;
    fully_shard(m, mesh, {.mp_policy = {.param_dtype = pd}, .init_dtype = DType::f32});
    const DType in = pd.value_or(DType::f32);
    Tensor x = test::random_tensor({5, 7}, 3, in);
    Tensor y = m.forward(x);
    m.backward(Tensor::full(y.shape(), 1.0, in));
    ASSERT_EQ(m.seen.size(), 12u);
    expect_aligned(m.seen, pd ? "bf16 param_dtype" : "f32");
  }
  // The DDP baseline's flat buffers (replicate, as fsdp-train --shard none lays them out).
  OddLinears plain;
  replicate(plain, mesh, {.init_dtype = DType::bf16, .seed = kSeed});
  Tensor x = test::random_tensor({5, 7}, 3, DType::bf16);
  Tensor y = plain.forward(x);
  plain.backward(Tensor::full(y.shape(), 1.0, DType::bf16));
  ASSERT_EQ(plain.seen.size(), 12u);
  expect_aligned(plain.seen, "replicate");
}

// ---------------------------------------------------------------- replicate (the DDP baseline)

// Whole parameters on every rank, each rank its own rows of the global batch, the gradients
// averaged by one all-reduce at the end of the backward (or of the last microbatch's).
Result replicated(const Run& run) {
  nn::TransformerConfig c = config(run);
  const int N = world()->size();
  nn::Transformer model(c);
  ReplicateModule& root = replicate(model, dist::init_device_mesh({N}, {"replicate"}),
                                    {.init_dtype = run.dtype, .seed = kSeed});
  optim::AdamW opt(root.param_groups(0.01), {.lr = 1e-2});
  Result r;
  r.losses = train_losses(model, root, opt, c, run);
  for (auto& [n, p] : model.named_parameters()) r.params.emplace_back(n, p->data.clone());
  return r;
}

TEST(Replicate, MatchesOneRankAndGradientAccumulation) {
  for (const fsdp::Run& run :
       {fsdp::Run{}, fsdp::Run{.accum = 2}, fsdp::Run{.arch = nn::Arch::seed},
        fsdp::Run{.kv_heads = 2, .head_dim = 6, .tied = true, .qkv_bias = true}}) {
    Result ref = reference(run), got = replicated(run);
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    for (size_t s = 0; s < ref.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-10 * std::abs(ref.losses[s]))
          << "step " << s << ", accum " << run.accum;
    ASSERT_EQ(got.params.size(), ref.params.size());
    for (size_t i = 0; i < ref.params.size(); ++i) {
      EXPECT_EQ(got.params[i].first, ref.params[i].first);
      EXPECT_LT(test::rel_error(got.params[i].second, ref.params[i].second), 1e-10)
          << ref.params[i].first;
    }
  }
}

// The same seed gives the model fully_shard gives, and a module that already holds values keeps
// them; the optimizer's group is the flat buffers, with the 1-D parameters as its no-decay
// ranges under decay_1d = false.
TEST(Replicate, ValuesAndParamGroups) {
  const nn::TransformerConfig c = config(fsdp::Run{.qkv_bias = true});
  auto mesh = dist::init_device_mesh({world()->size()}, {"replicate"});
  nn::Transformer sharded_model(c), model(c), given(c);
  for (size_t i = 0; i < sharded_model.layers().size(); ++i)
    fully_shard(sharded_model.layers()[i], mesh, {.init_dtype = DType::f64, .seed = kSeed});
  FSDPModule& sharded = fully_shard(sharded_model, mesh, {.init_dtype = DType::f64, .seed = kSeed});
  ReplicateModule& root = replicate(model, mesh, {.init_dtype = DType::f64, .seed = kSeed});
  nn::materialize(given, DType::f64, kSeed + 1);
  replicate(given, mesh, {.init_dtype = DType::f64, .seed = kSeed});
  auto full = sharded.sharded_parameters();
  auto named = model.named_parameters(), kept = given.named_parameters();
  ASSERT_EQ(full.size(), named.size());
  nn::Transformer other(c);
  nn::materialize(other, DType::f64, kSeed + 1);
  auto other_named = other.named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(test::rel_error(named[i].second->data, full[i].second.full_tensor()), 0.0)
        << named[i].first;
    EXPECT_EQ(test::rel_error(kept[i].second->data, other_named[i].second->data), 0.0)
        << kept[i].first;
  }

  const std::vector<nn::ParamGroup> decay_all = root.param_groups(0.1);
  const std::vector<nn::ParamGroup> groups = root.param_groups(0.1, false);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_TRUE(decay_all[0].no_decay.empty());
  EXPECT_EQ(groups[0].params.raw_data(), root.flat().params.raw_data());
  EXPECT_EQ(groups[0].grads.raw_data(), root.flat().grads.raw_data());
  std::vector<std::pair<int64_t, int64_t>> one_d;
  for (auto& [n, p] : named)
    if (p->shape.size() == 1)
      one_d.emplace_back((static_cast<const char*>(p->data.raw_data()) -
                          static_cast<const char*>(groups[0].params.raw_data())) /
                             int64_t(sizeof(double)),
                         p->data.numel());
  EXPECT_FALSE(one_d.empty());
  EXPECT_EQ(groups[0].no_decay, one_d);
}

// set_requires_gradient_sync(false) keeps the gradients local: no collective runs, and the
// next backward with true averages what was accumulated.
TEST(Replicate, NoSyncRunsNoCollective) {
  const nn::TransformerConfig c = config(fsdp::Run{});
  const int N = world()->size(), me = world()->rank();
  nn::Transformer model(c);
  ReplicateModule& root = replicate(model, dist::init_device_mesh({N}, {"replicate"}),
                                    {.init_dtype = DType::f64, .seed = kSeed});
  data::RandomTokenSource src(c.vocab, kSeed);
  const int64_t B = kGlobalRows / N;
  auto backward = [&] {
    auto b = src.batch(0, kGlobalRows, me * B, B, c.seq);
    Tensor logits = model.forward(b.inputs).view({B * c.seq, c.vocab});
    auto x = ops::cross_entropy_forward(logits, b.targets);
    model.backward(ops::cross_entropy_backward(logits, b.targets, x.lse).view({B, c.seq, c.vocab}));
  };
  model.zero_grad();
  root.set_requires_gradient_sync(false);
  const auto before = root.comm_stats();
  backward();
  const auto after = root.comm_stats();
  EXPECT_EQ(after.comm_seconds, before.comm_seconds);
  EXPECT_EQ(after.exposed_seconds, before.exposed_seconds);
  Tensor local = root.flat().grads.clone();
  root.set_requires_gradient_sync(true);
  root.zero_grad();
  backward();
  if (N > 1) EXPECT_GT(root.comm_stats().comm_seconds, after.comm_seconds);
  Tensor mean = local.clone();
  world()->all_reduce(mean, dist::ReduceOp::AVG)->wait();
  EXPECT_LT(test::rel_error(root.flat().grads, mean), 1e-14);
}

TEST(BadInput, ReplicateTwiceOverAShardedModuleOrOnA2DMesh) {
  const nn::TransformerConfig c = config(fsdp::Run{});
  auto mesh = dist::init_device_mesh({world()->size()});
  auto expect_refused = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "not refused: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  nn::Transformer twice(c);
  replicate(twice, mesh);
  expect_refused([&] { replicate(twice, mesh); },
                 "[replicate] Transformer is already replicated; apply replicate once per module");
  expect_refused([&] { fully_shard(twice, mesh); },
                 "[fully_shard] Transformer is replicated by replicate()");
  expect_refused([&] { fully_shard(twice.layers()[0], mesh); },
                 "[fully_shard] TransformerBlock 'layers.0' is inside Transformer, which "
                 "replicate() replicates");
  nn::Transformer sharded(c);
  fully_shard(sharded, mesh);
  expect_refused([&] { replicate(sharded, mesh); },
                 "[replicate] Transformer is sharded by fully_shard");
  expect_refused([&] { replicate(sharded.layers()[2], mesh); },
                 "[replicate] TransformerBlock 'layers.2' is inside Transformer, which fully_shard "
                 "shards");
  nn::Transformer inner(c);
  fully_shard(inner.layers()[1], mesh);
  expect_refused([&] { replicate(inner, mesh); }, "holds 'layers.1', which fully_shard shards");
  nn::Transformer flat2d(c);
  expect_refused(
      [&] {
        replicate(flat2d, dist::init_device_mesh({1, world()->size()}, {"a", "b"}));
      },
      "[replicate] the mesh must be 1-D");
}

// Under FSDP_DIST_DEVICE_CHECK=1 (its own ctest entries) the world is the device + host group
// of a CUDA run with a stand-in device half that refuses every tensor, as NCCL refuses host
// tensors. Every test above then passes only if fully_shard, clipping and the mesh's sub-groups
// send their host tensors through the world to the host engine. This one checks the stand-in
// has teeth, on the world and on a split of it.
TEST(DeviceHostWorld, TheDeviceHalfRefusesHostTensors) {
  auto* w = dynamic_cast<dist::DeviceHostGroup*>(world().get());
  if (!w) GTEST_SKIP() << "FSDP_DIST_DEVICE_CHECK is not set (world: " << world()->backend() << ")";
  EXPECT_NE(w->backend().find("-device-check+"), std::string::npos) << w->backend();
  Tensor t = Tensor::full({3}, 1.0, DType::f32);
  world()->all_reduce(t, dist::ReduceOp::SUM)->wait();  // through the world: the host half
  EXPECT_EQ(t.data<float>()[0], float(world()->size()));
  auto sub = std::dynamic_pointer_cast<dist::DeviceHostGroup>(world()->split(0, world()->rank()));
  ASSERT_TRUE(sub) << "a split of the world lost its host half";
  for (auto* g : {w->device_group().get(), sub->device_group().get()}) {
    try {
      g->all_reduce(t, dist::ReduceOp::SUM)->wait();
      FAIL() << "the device half took a host tensor";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("device half"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace fsdp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    fsdp::dist::init_process_group();
  } catch (const fsdp::Error& e) {
    fmt::print(stderr, "fsdp_test: error: {}\n", e.what());
    return 1;
  }
  int rc = RUN_ALL_TESTS();
  fsdp::dist::destroy_process_group();
  return rc;
}
