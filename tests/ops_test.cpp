// The op-case table (op_cases.h) on the CPU: every case's forward against its direct f64
// reference, its backward against f64 central differences and its `+=` into parameter
// gradients, its f32 and bf16 runs against f64, and its FLOPs and bytes against what the
// profiler records; every op of src/ops/backend.h has a case. Then what a table row cannot say:
// causality, grouped-query equivalences, the decode step against the causal rows, the saved
// statistics' dtypes, bad inputs.
#include "fsdp/ops/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/allocator.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/meta.h"
#include "fsdp/core/trace.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vec_math.h"
#include "op_cases.h"
#include "src/ops/backend.h"
#include "test_util.h"

namespace fsdp {
namespace {

using test::dot;
using test::expect_grad_matches;
using test::random_ids;
using test::random_tensor;
using test::rel_error;

// ---------------------------------------------------------------- the op-case table

TEST(OpCases, EveryBackendOpHasACase) {
  std::set<std::string_view> covered;
  for (const test::OpCase& c : test::op_cases())
    for (std::string_view op : c.covers) {
      EXPECT_NE(std::find_if(std::begin(ops::kBackendOpNames), std::end(ops::kBackendOpNames),
                             [&](const char* n) { return op == n; }),
                std::end(ops::kBackendOpNames))
          << c.what << " covers '" << op << "', which is not an op of src/ops/backend.h";
      covered.insert(op);
    }
  for (const char* op : ops::kBackendOpNames)
    EXPECT_TRUE(covered.count(op)) << "the op '" << op
                                   << "' of src/ops/backend.h has no case in tests/op_cases.cpp";
}

// The FLOPs and bytes the profiler records for the ops `f` runs.
ops::cost::Cost recorded_cost(const std::function<void()>& f) {
  trace::take();
  trace::start(false, false);
  f();
  trace::stop();
  ops::cost::Cost sum;
  for (const trace::Record& r : trace::take())
    if (r.kind == trace::Kind::op) sum.flops += r.flops, sum.bytes += r.bytes;
  return sum;
}

class OpCaseTest : public ::testing::TestWithParam<size_t> {
 protected:
  const test::OpCase& c() {
    static const std::vector<test::OpCase> cases = test::op_cases();
    return cases.at(GetParam());
  }
};

// f64: the reference, central differences, and the backward's `+=` (a second run whose
// parameter gradients start at 0.5 ends 0.5 above the first; returned gradients are equal).
TEST_P(OpCaseTest, F64AgainstReferenceAndFiniteDifferences) {
  const test::OpCase& c = this->c();
  std::vector<Tensor> in = test::make_inputs(c, DType::f64);
  test::CaseResult r = test::run_case(c, in, 0.0);
  if (c.reference) {
    std::vector<Tensor> ref = c.reference(in);
    ASSERT_EQ(ref.size(), r.fwd.out.size()) << c.what;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(r.fwd.out[i].shape(), ref[i].shape()) << c.what << " output " << i;
      EXPECT_LE(rel_error(r.fwd.out[i], ref[i]), c.ref_tol) << c.what << " output " << i;
    }
  }
  if (!c.backward) return;
  auto loss = [&] { return dot(c.forward(in, false).out[0], r.dout); };
  // Central differences at h = 1e-6 carry the loss's rounding over h: eps * sum|out * dout| / h
  // (10x that, and never under test_util's 1e-8), which grows with the case's size.
  constexpr double kH = 1e-6;
  const std::vector<double> o = r.fwd.out[0].to_f64_vector(), d = r.dout.to_f64_vector();
  double scale = 0;
  for (size_t k = 0; k < o.size(); ++k) scale += std::abs(o[k] * d[k]);
  const double fd_tol = std::max(1e-8, 10 * std::numeric_limits<double>::epsilon() * scale / kH);
  for (size_t i = 0; i < in.size(); ++i)
    if (c.inputs[i].grad != test::Grad::none)
      expect_grad_matches(fmt::format("{} d(input {})", c.what, i), loss, in[i], r.grads[i],
                          c.fd_probes, kH, fd_tol);
  test::CaseResult r2 = test::run_case(c, in, 0.5);
  for (size_t i = 0; i < in.size(); ++i) {
    if (c.inputs[i].grad == test::Grad::none) continue;
    const double shift = c.inputs[i].grad == test::Grad::accumulated ? 0.5 : 0.0;
    auto g = r.grads[i].to_f64_vector(), g2 = r2.grads[i].to_f64_vector();
    double worst = 0;
    for (size_t k = 0; k < g.size(); ++k) worst = std::max(worst, std::abs(g2[k] - g[k] - shift));
    EXPECT_LT(worst, 1e-12) << c.what << " input " << i << " (gradients added into)";
  }
}

// f32 and bf16 storage against f64 on the same rounded inputs and cotangent: 1e-5 and 1e-2 of
// ||f64|| (or the case's own), every output in the run's dtype (or f64: the loss, a sum).
TEST_P(OpCaseTest, OtherDtypesAgainstF64) {
  const test::OpCase& c = this->c();
  for (DType dt : c.dtypes) {
    if (dt == DType::f64) continue;
    const std::string what = c.what + " in " + std::string(dtype_name(dt));
    std::vector<Tensor> in = test::make_inputs(c, dt), in64;
    for (const Tensor& t : in) in64.push_back(is_floating(t.dtype()) ? t.to(DType::f64) : t);
    test::CaseResult r = test::run_case(c, in, 0.0), ref = test::run_case(c, in64, 0.0, dt);
    const double tol = dt == DType::f32 ? c.tol_f32 : c.tol_half;
    for (size_t i = 0; i < ref.fwd.out.size(); ++i) {
      const DType want = ref.fwd.out[i].dtype() == DType::f64 ? dt : ref.fwd.out[i].dtype();
      EXPECT_TRUE(r.fwd.out[i].dtype() == want || r.fwd.out[i].dtype() == DType::f64)
          << what << " output " << i << " is " << dtype_name(r.fwd.out[i].dtype());
      EXPECT_LT(rel_error(r.fwd.out[i], ref.fwd.out[i]), tol) << what << " output " << i;
    }
    for (size_t i = 0; i < in.size(); ++i)
      if (ref.grads[i].defined())
        EXPECT_LT(rel_error(r.grads[i], ref.grads[i]), tol) << what << " d(input " << i << ")";
  }
}

// The table's costs are the profiler's: what ops.cpp records while the case runs.
TEST_P(OpCaseTest, CostIsWhatTheProfilerRecords) {
  const test::OpCase& c = this->c();
  ASSERT_TRUE(c.forward_cost) << c.what;
  std::vector<Tensor> in = test::make_inputs(c, DType::f32);
  test::OpRun fwd;
  const ops::cost::Cost f = recorded_cost([&] { fwd = c.forward(in, false); });
  const ops::cost::Cost want = c.forward_cost(in, fwd);
  EXPECT_GT(want.bytes, 0) << c.what;
  EXPECT_DOUBLE_EQ(f.flops, want.flops) << c.what;
  EXPECT_DOUBLE_EQ(f.bytes, want.bytes) << c.what;
  if (!c.backward) return;
  ASSERT_TRUE(c.backward_cost) << c.what;
  Tensor dout = test::make_dout(c, fwd.out[0]);
  const double d0 = dout.numel() == 1 ? dout.item() : 0.0;
  std::vector<Tensor> acc = test::make_acc(c, in, 0.0);
  const test::BackwardArgs args{in, fwd, dout, d0, acc};
  const ops::cost::Cost b = recorded_cost([&] { c.backward(args); });
  EXPECT_DOUBLE_EQ(b.flops, c.backward_cost(args).flops) << c.what << " backward";
  EXPECT_DOUBLE_EQ(b.bytes, c.backward_cost(args).bytes) << c.what << " backward";
}

// The meta backend (src/ops/meta_ops.cpp) is the CPU backend's code over kernels that launch
// nothing: on meta inputs a forward allocates what it allocates on the CPU (the same number of
// blocks, the same peak above its inputs; 88 of the table's 89 cases to the byte, and clipping at
// least as much) and every output and gradient has the CPU's shape and dtype; nothing is left
// allocated once the results are gone.
TEST_P(OpCaseTest, MetaAllocatesWhatTheCpuAllocates) {
  const test::OpCase& c = this->c();
  for (DType dt : c.dtypes) {
    const std::string what = c.what + " in " + std::string(dtype_name(dt));
    const std::vector<Tensor> in = test::make_inputs(c, dt);
    Allocator& host = allocator_for(Device::cpu());
    const MemoryStats c0 = host.stats();
    host.reset_peak();
    const test::OpRun cpu = c.forward(in, false);
    const MemoryStats c1 = host.stats();
    const test::CaseResult cpu_all = test::run_case(c, in, 0.0);

    meta::reset({.device = Device::cpu()});
    {
      std::vector<Tensor> min;
      for (const Tensor& t : in) min.push_back(t.to(Device::meta()));
      Allocator& m = allocator_for(Device::meta());
      const MemoryStats m0 = m.stats();
      m.reset_peak();
      const test::OpRun meta = c.forward(min, false);
      const MemoryStats m1 = m.stats();
      // Clipping scales only when the norm is over its bound, which the meta backend cannot see:
      // it plans for the scaling.
      if (std::find(c.covers.begin(), c.covers.end(), "clip_scale_") != c.covers.end()) {
        EXPECT_GE(m1.allocations - m0.allocations, c1.allocations - c0.allocations) << what;
        EXPECT_GE(m1.peak - m0.current, c1.peak - c0.current) << what;
      } else {
        EXPECT_EQ(m1.allocations - m0.allocations, c1.allocations - c0.allocations) << what;
        EXPECT_EQ(m1.peak - m0.current, c1.peak - c0.current) << what;
      }
      ASSERT_EQ(meta.out.size(), cpu.out.size()) << what;
      for (size_t i = 0; i < cpu.out.size(); ++i) {
        EXPECT_EQ(meta.out[i].shape(), cpu.out[i].shape()) << what << " output " << i;
        EXPECT_EQ(meta.out[i].dtype(), cpu.out[i].dtype()) << what << " output " << i;
      }
      const test::CaseResult all = test::run_case(c, min, 0.0);
      for (size_t i = 0; i < in.size(); ++i) {
        ASSERT_EQ(all.grads[i].defined(), cpu_all.grads[i].defined())
            << what << " d(input " << i << ")";
        if (!all.grads[i].defined()) continue;
        EXPECT_TRUE(all.grads[i].device().is_meta()) << what;
        EXPECT_EQ(all.grads[i].shape(), cpu_all.grads[i].shape())
            << what << " d(input " << i << ")";
        EXPECT_EQ(all.grads[i].dtype(), cpu_all.grads[i].dtype())
            << what << " d(input " << i << ")";
      }
    }
    EXPECT_EQ(meta::stats().live, 0) << what << ": meta blocks left allocated";
  }
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  static const std::vector<test::OpCase> cases = test::op_cases();
  std::string name = std::to_string(info.param) + "_";
  for (char ch : cases.at(info.param).what)
    name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Table, OpCaseTest, ::testing::Range<size_t>(0, test::op_cases().size()),
                         case_name);

// perf_cases(), which fsdp-bench-kernels times on CUDA at a model's shapes, here on the CPU at a
// small one: each case's forward in place (the benchmark's repeated calls, which may update the
// inputs) gives what it gives on copies, and its forward's and backward's costs are what the
// profiler records.
TEST(OpCases, PerfCasesRunAtASmallShape) {
  const test::ModelShape m{
      .batch = 2, .seq = 16, .dim = 32, .heads = 4, .vocab = 50, .shard = 1000};
  for (const test::OpCase& c : test::perf_cases(m))
    for (DType dt : c.dtypes) {
      const std::string what = c.what + " in " + std::string(dtype_name(dt));
      ASSERT_TRUE(c.forward_cost) << what;
      std::vector<Tensor> in = test::make_inputs(c, dt, DType::i32), copies;
      for (const Tensor& t : in) copies.push_back(t.clone());
      const test::OpRun want = c.forward(copies, false);
      test::OpRun fwd;
      const ops::cost::Cost f = recorded_cost([&] { fwd = c.forward(in, true); });
      ASSERT_EQ(fwd.out.size(), want.out.size()) << what;
      for (size_t i = 0; i < want.out.size(); ++i)
        EXPECT_EQ(rel_error(fwd.out[i], want.out[i]), 0.0) << what << " output " << i;
      EXPECT_DOUBLE_EQ(f.flops, c.forward_cost(in, fwd).flops) << what;
      EXPECT_DOUBLE_EQ(f.bytes, c.forward_cost(in, fwd).bytes) << what;
      if (!c.backward) continue;
      ASSERT_TRUE(c.backward_cost) << what;
      Tensor dout = test::make_dout(c, fwd.out[0]);
      const double d0 = dout.numel() == 1 ? dout.item() : 0.0;
      std::vector<Tensor> acc = test::make_acc(c, in, 0.0);
      const test::BackwardArgs args{in, fwd, dout, d0, acc};
      const ops::cost::Cost b = recorded_cost([&] { c.backward(args); });
      EXPECT_DOUBLE_EQ(b.flops, c.backward_cost(args).flops) << what << " backward";
      EXPECT_DOUBLE_EQ(b.bytes, c.backward_cost(args).bytes) << what << " backward";
    }
}

// ---------------------------------------------------------------- what a row cannot say

TEST(VecMath, ExpF32IsAccurate) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.00137) {
    const double ref = std::exp(double(float(x)));
    worst = std::max(worst, std::abs(double(kernels::cpu::exp_f32(float(x))) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(kernels::cpu::exp_f32(-200.0f), 0.0f);
  EXPECT_EQ(kernels::cpu::exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(kernels::cpu::exp_f32(0.0f), 1.0f);
  EXPECT_GT(kernels::cpu::exp_f32(1000.0f), 1e38f);
}

// kernels/cpu/gemm_bf16.cpp, the bf16 GEMM, directly, on each engine the CPU has (AVX512_BF16's
// dot products; AMX's tiles where it has them): every layout, edges of the 12 x 32 tile and of
// AMX's 32 x 32 blocks, k over the 384- and 512-deep blocks and odd, rows over the per-thread
// blocks, alpha and beta; beta 0 never reads C (NaN there stays out). Against f64 sums of the same
// bf16 values: within 1e-6 of sum |a||b| (f32 sums of exact products).
TEST(Bf16Gemm, EveryLayoutAgainstF64) {
  if (!kernels::cpu::has_bf16_gemm()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  using kernels::cpu::Bf16Engine;
  const Bf16Engine before = kernels::cpu::bf16_gemm_engine();
  std::vector<Bf16Engine> engines = {Bf16Engine::avx512};
  if (kernels::cpu::has_amx_bf16())
    engines.push_back(Bf16Engine::amx);
  else
    std::printf("this CPU has no AMX tiles (or Linux gives none): AVX512_BF16 only\n");
  struct Shape3 {
    int64_t m, n, k;
  };
  for (const Bf16Engine engine : engines) {
    kernels::cpu::set_bf16_gemm_engine(engine);
    const char* name = engine == Bf16Engine::amx ? "amx" : "avx512";
    uint64_t state = 7;
    const auto next = [&] {  // a value in [-2, 2), rounded to bf16
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return bf16_to_f32(f32_to_bf16(float(int64_t(state >> 40) - (1 << 23)) / float(1 << 22)));
    };
    for (const Shape3 sh : {Shape3{1, 1, 1}, Shape3{13, 33, 7}, Shape3{37, 61, 769},
                            Shape3{800, 70, 45}, Shape3{24, 4100, 2}, Shape3{70, 40, 1100}})
      for (const bool ta : {false, true})
        for (const bool tb : {false, true})
          for (const float beta : {0.0f, 0.5f}) {
            const int64_t m = sh.m, n = sh.n, k = sh.k;
            const int64_t lda = ta ? m : k, ldb = tb ? k : n;
            std::vector<float> a(size_t(m * k)), b(size_t(k * n));
            std::vector<uint16_t> ab(a.size()), bb(b.size());
            for (size_t i = 0; i < a.size(); ++i) ab[i] = f32_to_bf16(a[i] = next()).bits;
            for (size_t i = 0; i < b.size(); ++i) bb[i] = f32_to_bf16(b[i] = next()).bits;
            std::vector<float> c(size_t(m * n));
            for (float& v : c) v = beta == 0.0f ? NAN : next();
            const std::vector<float> c0 = c;
            kernels::cpu::gemm_bf16(ta, tb, m, n, k, 1.5f, ab.data(), lda, bb.data(), ldb, beta,
                                    c.data(), n);
            double worst = 0;
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                double sum = 0, mag = 0;
                for (int64_t p = 0; p < k; ++p) {
                  const double x = a[size_t(ta ? p * lda + i : i * lda + p)];
                  const double y = b[size_t(tb ? j * ldb + p : p * ldb + j)];
                  sum += x * y;
                  mag += std::abs(x * y);
                }
                const double c_in = beta == 0.0f ? 0.0 : double(c0[size_t(i * n + j)]);
                const double want = 1.5 * sum + double(beta) * c_in;
                const double got = c[size_t(i * n + j)];
                ASSERT_TRUE(std::isfinite(got))
                    << m << "x" << n << "x" << k << " at " << i << "," << j;
                worst =
                    std::max(worst, std::abs(got - want) / (1.5 * mag + std::abs(c_in) + 1e-30));
              }
            EXPECT_LT(worst, 1e-6) << name << " " << m << "x" << n << "x" << k << " ta " << ta
                                   << " tb " << tb << " beta " << beta;
          }
  }
  kernels::cpu::set_bf16_gemm_engine(before);
}

TEST(RMSNorm, DefaultEpsIsTheMachineEpsilon) {
  EXPECT_DOUBLE_EQ(ops::default_rmsnorm_eps(DType::f32), 1.1920928955078125e-07);
  EXPECT_DOUBLE_EQ(ops::default_rmsnorm_eps(DType::f64), 2.220446049250313e-16);
}

TEST(Attention, CausalOutputIgnoresTheFuture) {
  Tensor qkv = random_tensor({1, 6, 3 * 4}, 52);
  Tensor out1 = ops::attention_forward(qkv, 1, true).out;
  Tensor qkv2 = qkv.clone();
  qkv2.narrow(1, 4, 2).fill_(7.0);  // change positions 4 and 5 only
  Tensor out2 = ops::attention_forward(qkv2, 1, true).out;
  EXPECT_EQ(rel_error(out2.narrow(1, 0, 4), out1.narrow(1, 0, 4)), 0.0);
}

// A decode step over a cache equals the causal attention's rows for those positions, with and
// without a sliding window.
TEST(Attention, DecodeOverACacheEqualsCausalRows) {
  const int64_t T = 7, H = 2, d = 8, past = 4, n = T - past;
  Tensor qkv = random_tensor({1, T, 3 * d}, 55);
  for (int64_t window : {3, 1}) {
    Tensor full = ops::attention_forward(qkv, H, true, 0, Tensor(), window).out.view({T, d});
    Tensor rows = qkv.view({T, 3 * d});
    Tensor q = rows.narrow(0, past, n).narrow(1, 0, d).contiguous();
    Tensor k = rows.narrow(1, d, d).contiguous(), v = rows.narrow(1, 2 * d, d).contiguous();
    EXPECT_LT(rel_error(ops::attention_decode(q, k, v, H, past, window), full.narrow(0, past, n)),
              1e-13)
        << "window " << window;
  }
  Tensor full = ops::attention_forward(qkv, H, true).out.view({T, d});
  Tensor rows = qkv.view({T, 3 * d});
  Tensor q = rows.narrow(0, past, n).narrow(1, 0, d).contiguous();
  Tensor k = rows.narrow(1, d, d).contiguous(), v = rows.narrow(1, 2 * d, d).contiguous();
  EXPECT_LT(rel_error(ops::attention_decode(q, k, v, H, past), full.narrow(0, past, n)), 1e-13);
  Tensor out32 =
      ops::attention_decode(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), H, past);
  EXPECT_EQ(out32.dtype(), DType::f32);
  EXPECT_LT(rel_error(out32, full.narrow(0, past, n)), 1e-5);
  EXPECT_THROW(ops::attention_decode(q, k, v, H, past + 1), Error);  // k holds past + n rows
  EXPECT_THROW(ops::attention_decode(q, k, v, 3, past), Error);      // 8 is not divisible by 3
}

// Grouped-query attention: a packed qkv [B, T, (H + 2 KV) hd] with each kv head repeated for the
// H / KV query heads of its group (Hugging Face's repeat_kv) gives the multi-head qkv
// [B, T, 3 H hd] that the grouped one must equal.
Tensor repeat_kv(const Tensor& qkv, int64_t H, int64_t KV) {
  const int64_t B = qkv.size(0), T = qkv.size(1), hd = qkv.size(2) / (H + 2 * KV);
  Tensor out = Tensor::empty({B, T, 3 * H * hd}, DType::f64);
  const double* src = qkv.data<double>();
  double* dst = out.data<double>();
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t from = part == 0 ? h : H + (part - 1) * KV + h / (H / KV);
        for (int64_t c = 0; c < hd; ++c)
          dst[(bt * 3 + part) * H * hd + h * hd + c] = src[bt * (H + 2 * KV) * hd + from * hd + c];
      }
  return out;
}

// The transpose of repeat_kv: a multi-head gradient summed back onto the grouped layout (dK and
// dV of a kv head are the sums over its query heads).
Tensor sum_kv(const Tensor& dmha, int64_t H, int64_t KV) {
  const int64_t B = dmha.size(0), T = dmha.size(1), hd = dmha.size(2) / (3 * H);
  Tensor out = Tensor::zeros({B, T, (H + 2 * KV) * hd}, DType::f64);
  const double* src = dmha.data<double>();
  double* dst = out.data<double>();
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t to = part == 0 ? h : H + (part - 1) * KV + h / (H / KV);
        for (int64_t c = 0; c < hd; ++c)
          dst[bt * (H + 2 * KV) * hd + to * hd + c] += src[(bt * 3 + part) * H * hd + h * hd + c];
      }
  return out;
}

// 4 query heads over 2 kv heads and over 1 (multi-query), head dim 6: the forward and its lse
// equal multi-head attention's over the repeated kv heads, and the backward equals its gradient
// summed over each group; T 130 crosses the CPU kernel's 128-row tile (the table's cases check
// the same shapes against the direct reference and central differences).
TEST(Attention, GroupedQueryEqualsRepeatedKv) {
  const int64_t H = 4, hd = 6;
  for (int64_t KV : {2, 1})
    for (int64_t T : {5, 130})
      for (bool causal : {false, true}) {
        const std::string what = fmt::format("kv {} T {} causal {}", KV, T, causal);
        Tensor qkv = random_tensor({2, T, (H + 2 * KV) * hd}, 80 + T + KV),
               r = random_tensor({2, T, H * hd}, 81 + T);
        auto a = ops::attention_forward(qkv, H, causal, KV);
        Tensor mha = repeat_kv(qkv, H, KV);
        auto m = ops::attention_forward(mha, H, causal);
        EXPECT_LT(rel_error(a.out, m.out), 1e-13) << what;
        EXPECT_LT(rel_error(a.lse, m.lse), 1e-13) << what;
        Tensor dqkv = ops::attention_backward(r, qkv, a.out, a.lse, H, causal, KV);
        EXPECT_EQ(dqkv.shape(), qkv.shape());
        EXPECT_LT(rel_error(dqkv, sum_kv(ops::attention_backward(r, mha, m.out, m.lse, H, causal),
                                         H, KV)),
                  1e-12)
            << what;
      }
  // Heads must be a multiple of the kv heads, and the width (H + 2 KV) hd.
  EXPECT_THROW(ops::attention_forward(random_tensor({1, 2, 7 * 4}, 3), 3, false, 2), Error);
  EXPECT_THROW(ops::attention_forward(random_tensor({1, 2, 9 * 4}, 3), 4, false, 2), Error);
}

// Rotary on a grouped qkv rotates its H query heads and KV key heads as the multi-head rotary
// does each head and leaves the values alone (its backward: the table's case of this shape).
TEST(Rope, GroupedQueryRotatesQueryAndKeyHeads) {
  const int64_t H = 4, KV = 2, hd = 6;
  Tensor qkv = random_tensor({2, 5, (H + 2 * KV) * hd}, 82);
  Tensor y = qkv.clone();
  ops::rope_(y, H, 100000.0, false, 3, KV);
  Tensor m = repeat_kv(qkv, H, KV);
  ops::rope_(m, H, 100000.0, false, 3);
  EXPECT_LT(rel_error(repeat_kv(y, H, KV), m), 1e-14);
}

// A decode step over a cache of kv heads equals the grouped causal attention's rows.
TEST(Attention, GroupedQueryDecodeEqualsCausalRows) {
  const int64_t T = 7, H = 4, hd = 6, past = 4, n = T - past;
  for (int64_t KV : {2, 1}) {
    const int64_t w = (H + 2 * KV) * hd;
    Tensor qkv = random_tensor({1, T, w}, 84 + KV);
    Tensor full = ops::attention_forward(qkv, H, true, KV).out.view({T, H * hd});
    Tensor rows = qkv.view({T, w});
    Tensor q = rows.narrow(0, past, n).narrow(1, 0, H * hd).contiguous();
    Tensor k = rows.narrow(1, H * hd, KV * hd).contiguous(),
           v = rows.narrow(1, (H + KV) * hd, KV * hd).contiguous();
    EXPECT_LT(rel_error(ops::attention_decode(q, k, v, H, past), full.narrow(0, past, n)), 1e-13)
        << "kv " << KV;
  }
  // k and v of 5 columns are no whole number of head-dim-6 kv heads.
  Tensor q = random_tensor({1, 24}, 1), k = random_tensor({1, 5}, 2);
  EXPECT_THROW(ops::attention_decode(q, k, k, 4, 0), Error);
}

TEST(Backend, SavedStatisticsInTheComputeDtype) {
  for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16})
    test::expect_backend_contract(Device::cpu(), d);
}

TEST(BadInput, MessagesNameTheValue) {
  Tensor w = random_tensor({5, 4}, 120);
  Tensor ids = Tensor::from_vector<int64_t>({1, 5}, {2});
  try {
    ops::embedding_forward(ids, w);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 5 at position 1 is outside [0, 5)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ops::linear_forward(random_tensor({2, 3}, 1), random_tensor({4, 5}, 2), Tensor()),
               Error);
  try {
    ops::attention_forward(random_tensor({1, 2, 3 * 6}, 3), 4, false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dim 6 is not divisible by heads 4"), std::string::npos)
        << e.what();
  }
  Tensor targets = Tensor::from_vector<int32_t>({0, 9}, {2});
  EXPECT_THROW(ops::cross_entropy_forward(random_tensor({2, 9}, 4), targets), Error);
}

// The MoE combine's row indices: the CPU reads them and names the bad one; its backward, whose
// writes would collide, refuses a row named twice; the weights must be f64 of pos's shape.
TEST(BadInput, MoECombineNamesTheRow) {
  Tensor rows = random_tensor({4, 3}, 5), dout = random_tensor({2, 3}, 6);
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Tensor out_of_range = Tensor::from_vector<int64_t>({0, 1, 4, 2}, {4});
  EXPECT_NE(message([&] { ops::moe_combine(rows, out_of_range, Tensor(), Tensor(), 2); })
                .find("pos[2] = 4 is outside the 4 rows"),
            std::string::npos);
  Tensor twice = Tensor::from_vector<int64_t>({0, 1, 1, 2}, {4});
  EXPECT_NO_THROW(ops::moe_combine(rows, twice, Tensor(), Tensor(), 2));  // a gather may repeat
  EXPECT_NE(message([&] { ops::moe_combine_backward(dout, rows, twice, Tensor(), 2); })
                .find("pos[2] = 1 names a row a second time"),
            std::string::npos);
  Tensor pos = Tensor::from_vector<int64_t>({3, 1, 0, 2}, {4});
  EXPECT_NE(message([&] { ops::moe_combine(rows, pos, random_tensor({4}, 7, DType::f32), Tensor(), 2); })
                .find("weight must be f64"),
            std::string::npos);
  EXPECT_NE(message([&] { ops::moe_combine(rows, pos, Tensor(), Tensor(), 3); })
                .find("pos must be i64 [N k] with k 3"),
            std::string::npos);
}

}  // namespace
}  // namespace fsdp
