// The bf16 GEMM (kernels/cpu/gemm_bf16.cpp: AVX512_BF16 dot products, f32 sums; and AMX's tiles,
// in the last columns, where the CPU has them) against the BLAS
// library's sgemm on the same values widened to f32, at SmolLM2-135M's shapes (dim 576, FFN 1536,
// vocab 49152, 512 rows a step) in the three layouts a linear layer runs (forward x W^T, dx = dy W,
// dW += dy^T x), at 1 and 2 threads. Each time is the best of 5 after a warm-up. The floor beside
// each is the time at twice the sgemm rate measured here on 2048^3 (VDPBF16PS does twice an FMA's
// FLOPs per instruction at the same throughput on the CPUs that have it): the ceiling of this run.
//   fsdp-bench-gemm-bf16
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <vector>

#include "fsdp/core/dtype.h"
#include "kernels/cpu/cpu_kernels.h"

namespace {

using fsdp::kernels::cpu::gemm;
using fsdp::kernels::cpu::Bf16Engine;
using fsdp::kernels::cpu::gemm_bf16;
using fsdp::kernels::cpu::set_bf16_gemm_engine;

template <class F>
double best_seconds(F&& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  if (!fsdp::kernels::cpu::has_bf16_gemm()) {
    std::printf("this CPU has no AVX512_BF16: no bf16 GEMM to measure\n");
    return 0;
  }
  const bool amx = fsdp::kernels::cpu::has_amx_bf16();
  struct Case {
    const char* what;
    bool ta, tb;
    int64_t m, n, k;
  };
  const int64_t rows = 512;
  const Case cases[] = {
      {"q/o fwd", false, true, rows, 576, 576},     {"up fwd", false, true, rows, 1536, 576},
      {"down fwd", false, true, rows, 576, 1536},   {"head fwd", false, true, rows, 49152, 576},
      {"up dx", false, false, rows, 576, 1536},     {"down dx", false, false, rows, 1536, 576},
      {"up dW", true, false, 1536, 576, rows},      {"down dW", true, false, 576, 1536, rows},
      {"head dW", true, false, 49152, 576, rows},
  };
  for (const int threads : {1, 2}) {
    omp_set_num_threads(threads);
    const double peak = fsdp::kernels::cpu::measure_sgemm_flops(2048, 2048, 2048, 3);
    std::printf("%d thread%s: sgemm 2048^3 %.1f GFLOP/s; bf16 ceiling taken as %.1f\n", threads,
                threads > 1 ? "s" : "", peak / 1e9, 2 * peak / 1e9);
    std::printf("  %-9s %5s %5s %5s | %9s %9s %9s | %7s", "gemm", "m", "n", "k", "bf16 ms",
                "floor ms", "sgemm ms", "speedup");
    if (amx) std::printf(" | %9s %9s %7s", "amx ms", "GFLOP/s", "speedup");
    std::printf("\n");
    for (const Case& c : cases) {
      const int64_t ar = c.ta ? c.k : c.m, ac = c.ta ? c.m : c.k;
      const int64_t br = c.tb ? c.n : c.k, bc = c.tb ? c.k : c.n;
      std::vector<uint16_t> a(size_t(ar * ac)), b(size_t(br * bc));
      std::vector<float> af(a.size()), bf(b.size()), cc(size_t(c.m * c.n));
      uint32_t s = 1;
      for (size_t i = 0; i < a.size(); ++i) {
        s = s * 1664525u + 1013904223u;
        a[i] = fsdp::f32_to_bf16(float(int(s >> 9) - (1 << 22)) / float(1 << 22)).bits;
        af[i] = fsdp::bf16_to_f32({a[i]});
      }
      for (size_t i = 0; i < b.size(); ++i) {
        s = s * 1664525u + 1013904223u;
        b[i] = fsdp::f32_to_bf16(float(int(s >> 9) - (1 << 22)) / float(1 << 22)).bits;
        bf[i] = fsdp::bf16_to_f32({b[i]});
      }
      const double flops = 2.0 * double(c.m) * double(c.n) * double(c.k);
      set_bf16_gemm_engine(Bf16Engine::avx512);
      const double t16 = best_seconds([&] {
        gemm_bf16(c.ta, c.tb, c.m, c.n, c.k, 1.0f, a.data(), ac, b.data(), bc, 0.0f, cc.data(), c.n);
      });
      double tamx = 0;
      if (amx) {
        set_bf16_gemm_engine(Bf16Engine::amx);
        tamx = best_seconds([&] {
          gemm_bf16(c.ta, c.tb, c.m, c.n, c.k, 1.0f, a.data(), ac, b.data(), bc, 0.0f, cc.data(),
                    c.n);
        });
      }
      const double t32 = best_seconds([&] {
        gemm<float>(c.ta, c.tb, c.m, c.n, c.k, 1.0f, af.data(), ac, bf.data(), bc, 0.0f,
                    cc.data(), c.n);
      });
      std::printf("  %-9s %5lld %5lld %5lld | %9.3f %9.3f %9.3f | %6.2fx", c.what,
                  (long long)c.m, (long long)c.n, (long long)c.k, t16 * 1e3,
                  flops / (2 * peak) * 1e3, t32 * 1e3, t32 / t16);
      if (amx)
        std::printf(" | %9.3f %9.1f %6.2fx", tamx * 1e3, flops / tamx / 1e9, t32 / tamx);
      std::printf("\n");
    }
  }
  return 0;
}
