// fsdp-bench-packing: what packed rows cost in attention on the CPU. Eight samples of 128 tokens
// packed into one row of 1024 positions (documents kept apart by doc_start) against the same
// samples as eight rows of 128, and against one unmasked causal row of 1024 (what a kernel that
// only masks, and computes every block, would pay at least). SmolLM2-135M's attention shape:
// 9 query heads over 3 kv heads of 64. Forward and backward, f32, best of several repetitions;
// the floor beside each time is its GEMM FLOPs at the sgemm ceiling measured in the same run.
//   fsdp-bench-packing [--threads N] [--samples 8] [--len 128]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/ops/ops.h"
#include "fsdp/profiler/ceilings.h"

using namespace fsdp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kHeads = 9, kKv = 3, kHd = 64;

Tensor uniform(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = float(double(x >> 11) / double(1ull << 53) - 0.5);
  }
  return t;
}

// Best time of one attention forward and backward.
double time_attention(const Tensor& qkv, const Tensor& doc_start, int reps) {
  const Tensor dout = uniform({qkv.size(0), qkv.size(1), kHeads * kHd}, 7);
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up
    const auto t0 = Clock::now();
    auto a = ops::attention_forward(qkv, kHeads, true, kKv, doc_start);
    Tensor d = ops::attention_backward(dout, qkv, a.out, a.lse, kHeads, true, kKv, doc_start);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
  }
  return best;
}

// The GEMM FLOPs of causal attention over documents of `len` positions, forward (QK^T, PV) and
// backward (QK^T again, dV, dP, dQ, dK): 7 products of len x len x hd per head, half of them
// causal.
double causal_flops(int64_t docs, int64_t len) {
  return double(docs) * 7.0 * 2.0 * double(kHeads) * double(len) * double(len + 1) / 2.0 *
         double(kHd);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  int64_t samples = 8, len = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--samples"))
      samples = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--len"))
      len = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: fsdp-bench-packing [--threads N] [--samples 8] [--len 128]\n");
      return 2;
    }
  }
  omp_set_num_threads(threads);
  const int64_t T = samples * len, w = (kHeads + 2 * kKv) * kHd;
  const Tensor rows = uniform({samples, len, w}, 1);
  const Tensor packed = rows.view({1, T, w});  // the same numbers, one row
  std::vector<int32_t> ds(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ds[size_t(t)] = int32_t(t / len * len);
  const Tensor doc_start = Tensor::from_vector(ds, {1, T});
  const int reps = 5;
  const double peak = profiler::sgemm_peak_flops(threads);
  const double t_rows = time_attention(rows, Tensor(), reps);
  const double t_packed = time_attention(packed, doc_start, reps);
  const double t_dense = time_attention(packed, Tensor(), reps);
  const double f_docs = causal_flops(samples, len), f_dense = causal_flops(1, T);
  std::printf(
      "fsdp-bench-packing: attention forward + backward, f32, %d threads, h%lld kv%lld hd %lld; "
      "sgemm ceiling %.1f GFLOP/s (measured or cached this run)\n",
      threads, (long long)kHeads, (long long)kKv, (long long)kHd, peak / 1e9);
  std::printf("| case | shape | best of %d (ms) | GEMM floor (ms) | vs %lld rows |\n", reps,
              (long long)samples);
  std::printf("|---|---|---|---|---|\n");
  std::printf("| %lld samples, one per row | [%lld, %lld] | %.2f | %.2f | 1.00 |\n",
              (long long)samples, (long long)samples, (long long)len, t_rows * 1e3,
              f_docs / peak * 1e3);
  std::printf("| %lld samples packed, doc_start | [1, %lld] | %.2f | %.2f | %.2f |\n",
              (long long)samples, (long long)T, t_packed * 1e3, f_docs / peak * 1e3,
              t_packed / t_rows);
  std::printf("| one causal row, no documents | [1, %lld] | %.2f | %.2f | %.2f |\n", (long long)T,
              t_dense * 1e3, f_dense / peak * 1e3, t_dense / t_rows);
  std::printf("packed / one per row = %.2f (the issue's bound: 1.3)\n", t_packed / t_rows);
  return 0;
}
