// The CUDA backend against the CPU reference (ggml's test-backend-ops): every
// op's forward and backward on fresh random inputs, in f32 (and TF32-free
// GEMMs) to 1e-5 and in bf16 to 1e-2, relative to ||ref||; never NaN. The
// allocator poisons every block it hands out (FSDP_CUDA_POISON=1, set by
// ctest), so an output element a kernel forgot to write shows up as NaN.
// Then the MiniLLM's 5-step losses on CUDA equal the CPU's within 1e-4.
// Skips with "no CUDA device" where no GPU is visible.
// The order is the GPU check's (scripts/gpu_check.sh runs each group as its own command with its
// own time cap): gtest lists plain TESTs first (Build.*, no GPU needed; Cuda.*), then the
// parameterized suites in the order they are declared here: the op table (OpTable/*, its
// verdicts first), then cuDNN's SDPA against our kernel, one test per shape and dtype
// (CudnnSdpa/*, bf16 before f16), then NCCL at one GPU (Nccl.*, plain TESTs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/allocator.h"
#include "fsdp/distributed/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "kernels/cuda/cuda_kernels.h"
#include "op_cases.h"
#include "test_util.h"

namespace fsdp {
namespace {

#define REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

const Device kGpu = Device::cuda(0);

bool any_nan(const Tensor& t) {
  for (double v : t.to_f64_vector())
    if (std::isnan(v)) return true;
  return false;
}

// Runs `f` on CPU f32 inputs and on the same inputs on CUDA in `dt`; compares every output.
void expect_matches(const std::string& what, const std::vector<Tensor>& inputs,
                    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& f,
                    DType dt, double tol) {
  std::vector<Tensor> cpu_in, gpu_in;
  for (const Tensor& t : inputs) {
    const bool is_float = is_floating(t.dtype());
    Tensor c = is_float ? t.to(dt).to(DType::f32) : t;  // the CPU sees the same rounded values
    cpu_in.push_back(c);
    gpu_in.push_back((is_float ? t.to(dt) : t).to(kGpu));
  }
  auto ref = f(cpu_in);
  auto got = f(gpu_in);
  ASSERT_EQ(ref.size(), got.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    Tensor g = got[i].to(Device::cpu());
    EXPECT_FALSE(any_nan(g)) << what << " output " << i << " has NaN (an element never written?)";
    EXPECT_LT(test::rel_error(g, ref[i]), tol)
        << what << " output " << i << " in " << dtype_name(dt);
  }
}

Tensor rnd(const Shape& s, uint64_t seed, double lo = -1, double hi = 1) {
  return test::random_tensor(s, seed, DType::f32, lo, hi);
}

class BackendOps : public ::testing::TestWithParam<DType> {};

TEST_P(BackendOps, EveryOpMatchesTheCpu) {
  REQUIRE_CUDA();
  const DType dt = GetParam();
  const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
  expect_matches(
      "linear", {rnd({4, 33, 40}, 1), rnd({24, 40}, 2), rnd({24}, 3)},
      [](auto& v) { return std::vector<Tensor>{ops::linear_forward(v[0], v[1], v[2])}; }, dt, tol);
  expect_matches(
      "linear_backward", {rnd({4, 33, 24}, 4), rnd({4, 33, 40}, 5), rnd({24, 40}, 6)},
      [](auto& v) {
        // Gradients are added into (dW by the GEMM's beta = 1, db after the BGRAD epilogue).
        Tensor dw = Tensor::full(v[2].shape(), 0.25, DType::f32, v[2].device());
        Tensor db = Tensor::full({24}, -0.5, DType::f32, v[2].device());
        Tensor dx = ops::linear_backward(v[0], v[1], v[2], dw, db);
        return std::vector<Tensor>{dx, dw, db};
      },
      dt, tol);
  // Operands at odd offsets (views one element into their buffers: 4-byte aligned in f32, 2 in
  // bf16): cuBLASLt is told the real alignment, and the under-aligned bias is added after the
  // GEMM instead of in its epilogue.
  auto at1 = [](const Tensor& t, const Shape& s) {
    return t.slice(1, 1 + shape_numel(s)).view(s);
  };
  expect_matches(
      "linear unaligned", {rnd({1 + 4 * 33 * 40}, 32), rnd({1 + 24 * 40}, 33), rnd({25}, 34)},
      [&](auto& v) {
        return std::vector<Tensor>{
            ops::linear_forward(at1(v[0], {4, 33, 40}), at1(v[1], {24, 40}), at1(v[2], {24}))};
      },
      dt, tol);
  expect_matches(
      "linear_backward unaligned",
      {rnd({1 + 4 * 33 * 24}, 35), rnd({1 + 4 * 33 * 40}, 36), rnd({1 + 24 * 40}, 37)},
      [&](auto& v) {
        const DType gt = v[2].dtype();
        Tensor dw = at1(Tensor::full({1 + 24 * 40}, 0.25, gt, v[2].device()), {24, 40});
        Tensor db = at1(Tensor::full({25}, -0.5, gt, v[2].device()), {24});
        Tensor dx = ops::linear_backward(at1(v[0], {4, 33, 24}), at1(v[1], {4, 33, 40}),
                                         at1(v[2], {24, 40}), dw, db);
        return std::vector<Tensor>{dx, dw, db};
      },
      dt, tol);
  // The bias gradient alone (no dW: no BGRAD epilogue) is sum_rows_into: many rows over a
  // 2-D grid of row chunks and column tiles, and few rows over more columns than a tile.
  for (std::pair<int64_t, int64_t> shape :
       {std::pair<int64_t, int64_t>{5000, 300}, {3, 2049}, {8192, 64}, {1, 1}}) {
    const int64_t rows = shape.first, cols = shape.second;
    expect_matches(
        fmt::format("sum_rows {}x{}", rows, cols),
        {rnd({rows, cols}, 38), rnd({rows, 8}, 39), rnd({cols, 8}, 40)},
        [cols](auto& v) {
          Tensor db = Tensor::full({cols}, -0.5, v[0].dtype(), v[0].device());  // added into
          Tensor db32 = Tensor::full({cols}, 0.25, DType::f32, v[0].device());
          Tensor dx = ops::linear_backward(v[0], v[1], v[2], Tensor(), db);
          ops::linear_backward(v[0], v[1], v[2], Tensor(), db32);
          return std::vector<Tensor>{dx, db, db32};
        },
        dt, tol);
  }
  Tensor ids = test::random_ids({3, 17}, 50, 7).to(DType::i32);
  expect_matches(
      "embedding", {ids, rnd({50, 24}, 8), rnd({3, 17, 24}, 9)},
      [](auto& v) {
        Tensor dw = Tensor::zeros({50, 24}, DType::f32, v[1].device());
        ops::embedding_backward(v[2], v[0], dw);
        return std::vector<Tensor>{ops::embedding_forward(v[0], v[1]), dw};
      },
      dt, tol);
  // Few rows (a block each), and more rows than the backward's blocks with more columns than a
  // block's threads (each block sums dw over several rows, each thread over several columns).
  for (std::pair<int64_t, int64_t> shape : {std::pair<int64_t, int64_t>{37, 96}, {1500, 1000}}) {
    const int64_t rows = shape.first, dim = shape.second;
    expect_matches(
        fmt::format("rmsnorm {}x{}", rows, dim),
        {rnd({rows, dim}, 10), rnd({dim}, 11, 0.5, 1.5), rnd({rows, dim}, 12)},
        [dim](auto& v) {
          auto o = ops::rmsnorm_forward(v[0], v[1], 1e-5);
          Tensor dw = Tensor::full({dim}, 0.25, DType::f32, v[1].device());  // added into
          Tensor dx = ops::rmsnorm_backward(v[2], v[0], v[1], o.rstd, dw);
          return std::vector<Tensor>{o.y, dx, dw};
        },
        dt, tol);
  }
  expect_matches(
      "silu", {rnd({1000}, 13, -4, 4), rnd({1000}, 14)},
      [](auto& v) {
        return std::vector<Tensor>{ops::silu_forward(v[0]), ops::silu_backward(v[1], v[0])};
      },
      dt, tol);
  expect_matches(
      "swiglu", {rnd({1000}, 15, -4, 4), rnd({1000}, 16), rnd({1000}, 17)},
      [](auto& v) {
        auto [dg, du] = ops::swiglu_backward(v[2], v[0], v[1]);
        return std::vector<Tensor>{ops::swiglu_forward(v[0], v[1]), dg, du};
      },
      dt, tol);
  expect_matches(
      "add", {rnd({999}, 18), rnd({999}, 19)},
      [](auto& v) { return std::vector<Tensor>{ops::add(v[0], v[1])}; }, dt, tol);
  // The elementwise, cast, activation and RMSNorm kernels take 16 bytes a thread-step where every
  // operand is aligned to them: over a multiple of the pack (1000), with a tail (1003), and at
  // odd offsets (one element into the buffer: one element a step), each against the CPU.
  for (int64_t at : {0, 1})
    for (int64_t n : {1000, 1003}) {
      auto view = [at](const Tensor& t, const Shape& s) {
        return t.slice(at, at + shape_numel(s)).view(s);
      };
      expect_matches(
          fmt::format("elementwise n={} offset={}", n, at),
          {rnd({1 + n}, 41, -4, 4), rnd({1 + n}, 42), rnd({1 + n}, 43), rnd({1 + 8 * 96}, 44),
           rnd({1 + 96}, 45, 0.5, 1.5)},
          [&](auto& v) {
            const Tensor g = view(v[0], {n}), u = view(v[1], {n}), d = view(v[2], {n});
            const Tensor x = view(v[3], {8, 96}), w = view(v[4], {96});
            Tensor sum = ops::add(g, u);
            Tensor acc = view(Tensor::full({1 + n}, 0.5, DType::f32, g.device()), {n});
            ops::add_(acc, d);  // f32 += the compute dtype (4 elements a step in bf16 too)
            ops::scale_(sum, -1.5);
            auto [dg, du] = ops::swiglu_backward(d, g, u, ops::Gate::gelu_tanh);
            auto o = ops::rmsnorm_forward(x, w, 1e-5, 1.0);
            Tensor dw = Tensor::full({96}, 0.25, DType::f32, w.device());
            Tensor dx = ops::rmsnorm_backward(x, x, w, o.rstd, dw, 1.0);
            return std::vector<Tensor>{sum,
                                       acc,
                                       g.to(DType::bf16).to(DType::f32),  // casts
                                       ops::silu_forward(g),
                                       ops::silu_backward(d, g),
                                       ops::swiglu_forward(g, u, ops::Gate::gelu_tanh),
                                       dg,
                                       du,
                                       o.y,
                                       dx,
                                       dw,
                                       Tensor::full({1}, ops::sum_squares(d), DType::f32)};
          },
          dt, tol);
    }
  for (bool causal : {false, true})
    for (int64_t hd : {16, 64, 128})
      expect_matches(
          fmt::format("attention causal={} hd={}", causal, hd),
          {rnd({2, 45, 3 * 2 * hd}, 20), rnd({2, 45, 2 * hd}, 21)},
          [&](auto& v) {
            Tensor qkv = v[0].clone();
            ops::rope_(qkv, 2, 10000.0, false);
            auto a = ops::attention_forward(qkv, 2, causal);
            Tensor d = ops::attention_backward(v[1], qkv, a.out, a.lse, 2, causal);
            ops::rope_(d, 2, 10000.0, true);
            return std::vector<Tensor>{a.out, d};
          },
          dt, tol);
  // Grouped-query attention: 4 query heads over 2 and over 1 kv heads (the dk/dv pass sums a
  // group), rotary on the q and k heads.
  for (int64_t kv : {2, 1})
    for (bool causal : {false, true})
      expect_matches(
          fmt::format("attention gqa kv={} causal={}", kv, causal),
          {rnd({2, 37, (4 + 2 * kv) * 32}, 27), rnd({2, 37, 4 * 32}, 28)},
          [&](auto& v) {
            Tensor qkv = v[0].clone();
            ops::rope_(qkv, 4, 10000.0, false, 0, kv);
            auto a = ops::attention_forward(qkv, 4, causal, kv);
            Tensor d = ops::attention_backward(v[1], qkv, a.out, a.lse, 4, causal, kv);
            ops::rope_(d, 4, 10000.0, true, 0, kv);
            return std::vector<Tensor>{a.out, d};
          },
          dt, tol);
  expect_matches(
      "attention_decode gqa", {rnd({3, 4 * 32}, 29), rnd({40, 32}, 30), rnd({40, 32}, 31)},
      [&](auto& v) { return std::vector<Tensor>{ops::attention_decode(v[0], v[1], v[2], 4, 37)}; },
      dt, tol);
  // Generation: rotary at an offset, and a decode step over a 300-position cache.
  expect_matches(
      "rope offset / attention_decode",
      {rnd({1, 5, 3 * 128}, 24), rnd({300, 128}, 25), rnd({300, 128}, 26)},
      [&](auto& v) {
        Tensor qkv = v[0].clone();
        ops::rope_(qkv, 2, 10000.0, false, 295);
        Tensor q = Tensor::empty({5 * 128}, qkv.dtype(), qkv.device());
        std::vector<ops::Segment> rows;
        for (int64_t r = 0; r < 5; ++r) rows.push_back({r * 128, r * 3 * 128, 128});
        ops::copy_segments(q, qkv.view({5 * 3 * 128}), rows);
        q = q.view({5, 128});
        return std::vector<Tensor>{qkv, ops::attention_decode(q, v[1], v[2], 2, 295)};
      },
      dt, tol);
  Tensor targets = test::random_ids({70}, 300, 22).to(DType::i32);
  expect_matches(
      "cross_entropy", {rnd({70, 300}, 23, -3, 3), targets},
      [](auto& v) {
        auto x = ops::cross_entropy_forward(v[0], v[1]);
        Tensor d = ops::cross_entropy_backward(v[0], v[1], x.lse, 1.0);
        return std::vector<Tensor>{Tensor::full({1}, x.loss, DType::f32), d};
      },
      dt, tol);
}

INSTANTIATE_TEST_SUITE_P(OpTable, BackendOps, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The op-case table (tests/op_cases.h) on CUDA against the CPU: each case's outputs and
// gradients from the same rounded inputs and cotangent (ids in i32), the CPU in f32; f32 to the
// case's tol_f32, bf16 to its tol_half, relative to ||cpu||; never NaN.
class OpTableOnCuda : public ::testing::TestWithParam<size_t> {
 protected:
  static const std::vector<test::OpCase>& cases() {
    static const std::vector<test::OpCase> all = test::op_cases();
    return all;
  }
};

TEST_P(OpTableOnCuda, MatchesTheCpu) {
  REQUIRE_CUDA();
  const test::OpCase& c = cases().at(GetParam());
  for (DType dt : {DType::f32, DType::bf16}) {
    if (std::find(c.dtypes.begin(), c.dtypes.end(), dt) == c.dtypes.end()) continue;
    const std::string what = c.what + " in " + std::string(dtype_name(dt));
    std::vector<Tensor> in = test::make_inputs(c, dt, DType::i32), cpu_in, gpu_in;
    for (const Tensor& t : in) {
      cpu_in.push_back(is_floating(t.dtype()) ? t.to(DType::f32) : t);
      gpu_in.push_back(t.to(kGpu));
    }
    const test::CaseResult ref = test::run_case(c, cpu_in, 0.25, dt);
    const test::CaseResult got = test::run_case(c, gpu_in, 0.25, dt);
    const double tol = dt == DType::f32 ? c.tol_f32 : c.tol_half;
    ASSERT_EQ(got.fwd.out.size(), ref.fwd.out.size()) << what;
    for (size_t i = 0; i < ref.fwd.out.size(); ++i) {
      Tensor g = got.fwd.out[i].to(Device::cpu());
      EXPECT_FALSE(any_nan(g)) << what << " output " << i << " has NaN";
      EXPECT_LT(test::rel_error(g, ref.fwd.out[i]), tol) << what << " output " << i;
    }
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      if (!ref.grads[i].defined()) continue;
      Tensor g = got.grads.at(i).to(Device::cpu());
      EXPECT_FALSE(any_nan(g)) << what << " d(input " << i << ") has NaN";
      EXPECT_LT(test::rel_error(g, ref.grads[i]), tol) << what << " d(input " << i << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OpTable, OpTableOnCuda,
                         ::testing::Range<size_t>(0, test::op_cases().size()));

#if FSDP_WITH_CUDA  // the plan is host code of the CUDA kernels, absent from a CPU-only build
// Runs without a GPU: sum_rows_into's split of the rows covers every row once, within the
// grid's limits, and a linear backward's bias gradient (8192 rows x 2048 columns) fills the GPU
// (it ran on 8 blocks, one thread per column looping over all the rows: about 1 ms).
TEST(Cuda, SumRowsSplitCoversEveryRowOnceAndFillsTheGpu) {
  namespace kc = kernels::cuda;
  for (int64_t rows : std::initializer_list<int64_t>{0, 1, 3, 63, 64, 65, 1000, 5000, 8192, 100003,
                                                    int64_t(1) << 26})
    for (int64_t cols : std::initializer_list<int64_t>{1, 31, 32, 33, 300, 2048, 2049, 50257}) {
      const kc::SumRowsPlan p = kc::sum_rows_plan(rows, cols);
      const std::string at = fmt::format("{} x {}", rows, cols);
      EXPECT_EQ(p.col_tiles, (cols + 31) / 32) << at;
      EXPECT_GE(p.chunks, 1) << at;
      EXPECT_LE(p.chunks, 65535) << at;
      EXPECT_GE(p.chunk, 1) << at;
      EXPECT_GE(p.chunks * p.chunk, rows) << at;                   // every row in a chunk
      if (rows > 0) EXPECT_LT((p.chunks - 1) * p.chunk, rows) << at;  // no empty chunk
    }
  const kc::SumRowsPlan big = kc::sum_rows_plan(8192, 2048);
  EXPECT_GE(big.col_tiles * big.chunks, 512) << "blocks for the bias gradient of 8192 x 2048";
}
#endif

#if FSDP_WITH_CUDA
// cuDNN's version, loaded and compiled against (no GPU needed): the GPU check prints this line in
// its summary. The loaded one must share the headers' major and be no older than them: a graph
// the frontend builds for newer headers can be refused by an older library.
TEST(Build, CudnnLoadedBesideTheHeadersItWasBuiltAgainst) {
  namespace kc = kernels::cuda;
  std::printf("cudnn-versions: %s\n", kc::cudnn_versions().c_str());
  if (kc::cudnn_built_version() == 0) GTEST_SKIP() << "no cuDNN in this build";
  EXPECT_EQ(kc::cudnn_loaded_version() / 10000, kc::cudnn_built_version() / 10000)
      << kc::cudnn_versions();
  EXPECT_GE(kc::cudnn_loaded_version(), kc::cudnn_built_version())
      << kc::cudnn_versions() << ": an older cuDNN than the headers";
}
#endif

#if FSDP_WITH_CUDNN
// cuDNN's SDPA against our own kernel on the same device and inputs, at shapes the MiniLLM uses
// (odd T too), one test per shape and dtype so that a refused shape fails by its name and the
// others still run: outputs, lse and every gradient, causal or not and the causal window; and
// each backward after the other's forward, since the two share the lse convention. A shape cuDNN
// refuses fails here (the op itself would fall back to our kernel quietly).
struct SdpaShape {
  DType dt;
  int64_t B, T, H, KV, hd;
};

// gtest prints a parameter beside a failure's name: the shape in words, not its bytes.
void PrintTo(const SdpaShape& s, std::ostream* os) {
  *os << fmt::format("B {} T {} H {} KV {} hd {} {}", s.B, s.T, s.H, s.KV, s.hd, dtype_name(s.dt));
}

class CudnnAttention : public ::testing::TestWithParam<SdpaShape> {};

TEST_P(CudnnAttention, MatchesOurKernel) {
  REQUIRE_CUDA();
  namespace kc = kernels::cuda;
  const SdpaShape c = GetParam();
  const DType dt = c.dt;
  for (auto [causal, window] : {std::pair{false, int64_t(0)}, std::pair{true, int64_t(0)},
                                std::pair{true, int64_t(64)}}) {
    const std::string what =
        fmt::format("B {} T {} H {} KV {} hd {} {} causal={} window {} ({})", c.B, c.T, c.H, c.KV,
                    c.hd, dtype_name(dt), causal, window, kc::cudnn_versions());
    const int64_t fw =
        kc::cudnn_attention_workspace(false, dt, c.B, c.T, c.H, c.KV, c.hd, causal, window, 0);
    const int64_t bw =
        kc::cudnn_attention_workspace(true, dt, c.B, c.T, c.H, c.KV, c.hd, causal, window, 0);
    ASSERT_GE(fw, 0) << "cuDNN refused the forward of " << what << ": "
                     << kc::cudnn_attention_refusal(false, dt, c.B, c.T, c.H, c.KV, c.hd, causal,
                                                    window, 0);
    ASSERT_GE(bw, 0) << "cuDNN refused the backward of " << what << ": "
                     << kc::cudnn_attention_refusal(true, dt, c.B, c.T, c.H, c.KV, c.hd, causal,
                                                    window, 0);
    const int64_t d = c.H * c.hd;
    Tensor qkv = rnd({c.B, c.T, (c.H + 2 * c.KV) * c.hd}, 40, -2, 2).to(dt).to(kGpu);
    Tensor dout = rnd({c.B, c.T, d}, 41).to(dt).to(kGpu);
    auto out = [&] { return Tensor::empty({c.B, c.T, d}, dt, kGpu); };
    auto lse = [&] { return Tensor::empty({c.B, c.H, c.T}, DType::f32, kGpu); };
    auto grad = [&] { return Tensor::empty(qkv.shape(), dt, kGpu); };
    Tensor ws = Tensor::empty({std::max<int64_t>(fw, bw) / 8 + 1}, DType::i64, kGpu);
    Tensor o1 = out(), l1 = lse(), o2 = out(), l2 = lse();
    kc::attention_forward(qkv.raw_data(), o1.raw_data(), l1.data<float>(), dt, c.B, c.T, c.H,
                          c.KV, c.hd, causal, nullptr, window, 0, nullptr);
    kc::cudnn_attention_forward(qkv.raw_data(), o2.raw_data(), l2.data<float>(), dt, c.B, c.T,
                                c.H, c.KV, c.hd, causal, window, ws.raw_data(), 0, nullptr);
    EXPECT_LT(test::rel_error(o2.to(Device::cpu()), o1.to(Device::cpu())), 1e-2) << what;
    EXPECT_LT(test::rel_error(l2.to(Device::cpu()), l1.to(Device::cpu())), 1e-4) << what;
    Tensor g1 = grad(), g2 = grad(), g3 = grad();
    kc::attention_backward(dout.raw_data(), qkv.raw_data(), o1.raw_data(), l1.data<float>(),
                           g1.raw_data(), dt, c.B, c.T, c.H, c.KV, c.hd, causal, nullptr, window,
                           0, nullptr);
    kc::cudnn_attention_backward(dout.raw_data(), qkv.raw_data(), o2.raw_data(), l2.data<float>(),
                                 g2.raw_data(), dt, c.B, c.T, c.H, c.KV, c.hd, causal, window,
                                 ws.raw_data(), 0, nullptr);
    kc::cudnn_attention_backward(dout.raw_data(), qkv.raw_data(), o1.raw_data(), l1.data<float>(),
                                 g3.raw_data(), dt, c.B, c.T, c.H, c.KV, c.hd, causal, window,
                                 ws.raw_data(), 0, nullptr);
    Tensor ref = g1.to(Device::cpu());
    EXPECT_FALSE(any_nan(g2.to(Device::cpu()))) << what;
    EXPECT_LT(test::rel_error(g2.to(Device::cpu()), ref), 2e-2) << what;
    EXPECT_LT(test::rel_error(g3.to(Device::cpu()), ref), 2e-2) << what;
  }
}

// bf16 first (the runs' dtype): `--gtest_filter='CudnnSdpa/*/bf16_*'` runs those alone.
std::vector<SdpaShape> sdpa_shapes() {
  std::vector<SdpaShape> all;
  for (DType dt : {DType::bf16, DType::f16})
    for (SdpaShape s : {SdpaShape{dt, 2, 256, 4, 4, 64}, SdpaShape{dt, 1, 200, 2, 2, 128},
                        SdpaShape{dt, 2, 1024, 2, 2, 128}, SdpaShape{dt, 2, 256, 9, 3, 64},
                        SdpaShape{dt, 1, 200, 4, 1, 64}})
      all.push_back(s);
  return all;
}

INSTANTIATE_TEST_SUITE_P(CudnnSdpa, CudnnAttention, ::testing::ValuesIn(sdpa_shapes()),
                         [](const auto& info) {
                           const SdpaShape& s = info.param;
                           return fmt::format("{}_B{}_T{}_H{}_KV{}_hd{}", dtype_name(s.dt), s.B,
                                              s.T, s.H, s.KV, s.hd);
                         });
#endif

TEST(Cuda, SavedStatisticsInTheComputeDtypeAsOnCpu) {
  REQUIRE_CUDA();
  for (DType d : {DType::f32, DType::bf16, DType::f16})
    test::expect_backend_contract(Device::cuda(0), d);
}

TEST(Cuda, AdamWAndCopySegmentsMatchTheCpu) {
  REQUIRE_CUDA();
  Tensor p = rnd({5000}, 30), g = rnd({5000}, 31);
  Tensor m = Tensor::zeros({5000}, DType::f32), v = Tensor::zeros({5000}, DType::f32);
  Tensor gp = p.to(kGpu), gg = g.to(kGpu), gm = m.to(kGpu), gv = v.to(kGpu);
  for (int64_t s = 1; s <= 3; ++s) {
    ops::adamw_(p, g, m, v, {.lr = 1e-2}, s);
    ops::adamw_(gp, gg, gm, gv, {.lr = 1e-2}, s);
  }
  EXPECT_LT(test::rel_error(gp.to(Device::cpu()), p), 1e-6);
  Tensor src = rnd({100}, 32), dst = Tensor::zeros({60}, DType::f32);
  std::vector<ops::Segment> segs = {{0, 10, 20}, {30, 70, 30}};
  Tensor gdst = dst.to(kGpu).to(DType::bf16);
  ops::copy_segments(dst, src, segs);
  ops::copy_segments(gdst, src.to(kGpu), segs);
  EXPECT_LT(test::rel_error(gdst.to(Device::cpu()), dst), 1e-2);
}

TEST(Cuda, CastRoundTripAndAllocatorCounts) {
  REQUIRE_CUDA();
  Tensor x = rnd({1000}, 1, -4, 4);
  for (DType d : {DType::bf16, DType::f16, DType::f64})
    EXPECT_EQ(x.to(kGpu).to(d).to(Device::cpu()).to_f64_vector(), x.to(d).to_f64_vector())
        << dtype_name(d);
  const int64_t before = memory_stats(kGpu).current;
  {
    Tensor t = Tensor::empty({1 << 20}, DType::f32, kGpu);
    EXPECT_EQ(memory_stats(kGpu).current - before, 4 << 20);
  }
  EXPECT_EQ(memory_stats(kGpu).current, before);
  EXPECT_GE(memory_stats(kGpu).reserved, 4 << 20);  // cached for the next step
}

// `sharded`: fully_shard on every block and the root, over NCCL, with `mp`; `events` (sharded
// only) gets the root's event log of the five steps.
std::vector<double> five_steps(nn::Arch arch, Device device, bool sharded = false,
                               MixedPrecisionPolicy mp = {},
                               std::vector<std::string>* events = nullptr) {
  nn::TransformerConfig c;
  c.arch = arch;
  c.vocab = 97;
  c.dim = 64;
  c.layers = 2;
  c.heads = 4;
  c.seq = 32;
  c.batch = 3;
  nn::Transformer model(c);
  nn::FlatParameters flat;
  std::vector<nn::ParamGroup> groups;
  FSDPModule* root = nullptr;
  if (sharded) {
    auto mesh = dist::init_device_mesh({dist::world()->size()});
    for (size_t i = 0; i < model.layers().size(); ++i)
      fully_shard(model.layers()[i], mesh, {.mp_policy = mp, .seed = 5});
    root = &fully_shard(model, mesh, {.mp_policy = mp, .seed = 5});
    groups = root->param_groups(0.01);
    if (events) root->set_event_log(true);
  } else {
    flat = nn::materialize(model, DType::f32, 5, device);
    groups = {{flat.params, flat.grads, 0.01}};
  }
  optim::AdamW opt(groups, {.lr = 3e-3});
  std::vector<double> losses;
  for (int s = 0; s < 5; ++s) {
    Tensor tok =
        test::random_ids({c.batch, c.seq}, c.vocab, 100 + uint64_t(s)).to(DType::i32).to(device);
    Tensor tgt =
        test::random_ids({c.batch * c.seq}, c.vocab, 200 + uint64_t(s)).to(DType::i32).to(device);
    if (root)
      root->zero_grad();
    else
      flat.grads.zero_();
    Tensor logits = model.forward(tok).view({c.batch * c.seq, c.vocab});
    auto x = ops::cross_entropy_forward(logits, tgt);
    model.backward(ops::cross_entropy_backward(logits, tgt, x.lse).view({c.batch, c.seq, c.vocab}));
    opt.step();
    losses.push_back(x.loss);
  }
  if (root && events) *events = root->take_event_log();
  return losses;
}

TEST(Cuda, MiniLLMFiveStepsMatchTheCpu) {
  REQUIRE_CUDA();
  for (nn::Arch arch : {nn::Arch::seed, nn::Arch::decoder}) {
    auto cpu = five_steps(arch, Device::cpu()), gpu = five_steps(arch, kGpu);
    for (size_t s = 0; s < cpu.size(); ++s)
      EXPECT_NEAR(gpu[s], cpu[s], 1e-4 * std::abs(cpu[s])) << nn::arch_name(arch) << " step " << s;
  }
}

TEST(Nccl, CollectivesAndFullyShardAtWorldSizeOne) {
  REQUIRE_CUDA();
  auto pg = dist::init_process_group({.device = kGpu});
  EXPECT_EQ(pg->backend(), "nccl");
  Tensor in = rnd({64}, 40).to(kGpu), out = Tensor::empty({64}, DType::f32, kGpu);
  pg->all_gather_into_tensor(out, in)->wait();
  EXPECT_EQ(out.to_f64_vector(), in.to_f64_vector());
  pg->reduce_scatter_tensor(out, in, dist::ReduceOp::AVG)->wait();
  EXPECT_EQ(out.to_f64_vector(), in.to_f64_vector());
  // Same dtypes: the parameters are the shards themselves, no collective.
  auto plain = five_steps(nn::Arch::decoder, kGpu), sharded = five_steps(nn::Arch::decoder, kGpu, true);
  for (size_t s = 0; s < plain.size(); ++s)
    EXPECT_NEAR(sharded[s], plain[s], 1e-6 * plain[s]) << "step " << s;
  // bf16 parameters and f32 reduction: all-gather, copy-out, chunk-cat and reduce-scatter over
  // NCCL.
  auto mixed = five_steps(nn::Arch::decoder, kGpu, true,
                          {.param_dtype = DType::bf16, .reduce_dtype = DType::f32});
  for (size_t s = 0; s < plain.size(); ++s)
    EXPECT_NEAR(mixed[s], plain[s], 2e-2 * plain[s]) << "step " << s;
  dist::destroy_process_group();
}

// At one GPU the one-rank shortcut (a cast of the shard, the gradient added into it) skips NCCL;
// with it off (FSDP_ONE_RANK_CAST=0) the mixed-precision five steps take the path of a multi-GPU
// job: each group's all-gather and reduce-scatter on their own communicators and streams
// (ncclCommSplit), waited for through events. The event log shows every group gathered and
// reduced on each step and nothing cast; the losses follow the shortcut's (1e-4: the
// embedding's gradient sums with f32 atomics, in no fixed order).
TEST(Nccl, MixedPrecisionThroughTheCollectivesAtOneGpu) {
  REQUIRE_CUDA();
  auto pg = dist::init_process_group({.device = kGpu});
  ASSERT_EQ(pg->backend(), "nccl");
  const MixedPrecisionPolicy mp{.param_dtype = DType::bf16, .reduce_dtype = DType::f32};
  std::vector<std::string> shortcut_log, nccl_log;
  ::setenv("FSDP_ONE_RANK_CAST", "1", 1);
  const auto shortcut = five_steps(nn::Arch::decoder, kGpu, true, mp, &shortcut_log);
  ::setenv("FSDP_ONE_RANK_CAST", "0", 1);
  const auto nccl = five_steps(nn::Arch::decoder, kGpu, true, mp, &nccl_log);
  ::setenv("FSDP_ONE_RANK_CAST", "1", 1);
  dist::destroy_process_group();
  ASSERT_EQ(nccl.size(), shortcut.size());
  for (size_t s = 0; s < nccl.size(); ++s)
    EXPECT_NEAR(nccl[s], shortcut[s], 1e-4 * std::abs(shortcut[s])) << "step " << s;
  const auto count = [](const std::vector<std::string>& log, const std::string& what) {
    return int(std::count_if(log.begin(), log.end(),
                             [&](const std::string& e) { return e.rfind(what + ":", 0) == 0; }));
  };
  // Two blocks and the root: three groups, five steps.
  const int gathers = 3 * 5;
  EXPECT_EQ(count(shortcut_log, "ag_issue"), 0) << "the shortcut gathered";
  EXPECT_GE(count(shortcut_log, "cast"), gathers);
  EXPECT_GE(count(nccl_log, "ag_issue"), gathers) << "groups not all-gathered over NCCL";
  EXPECT_EQ(count(nccl_log, "ag_wait"), count(nccl_log, "ag_issue"));
  EXPECT_EQ(count(nccl_log, "rs_issue"), gathers) << "gradients not reduce-scattered over NCCL";
  EXPECT_EQ(count(nccl_log, "rs_wait"), gathers);
  EXPECT_EQ(count(nccl_log, "cast"), 0);
  EXPECT_EQ(count(nccl_log, "grad_add"), 0);
}

}  // namespace
}  // namespace fsdp
