// GEMM through OpenBLAS (the OpenMP build, so that BLAS and our kernels share
// one thread pool; called inside an omp parallel region it runs on the
// calling thread). Row-major throughout. The sgemm peak measured here is the
// ceiling that fsdp-train's MFU is measured against.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace fsdp::kernels::cpu {

template <>
void gemm<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m),
              int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

template <>
void gemm<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m),
              int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

const char* blas_core_name() { return openblas_get_corename(); }

double measure_sgemm_flops(int64_t m, int64_t n, int64_t k, int repeats) {
  std::vector<float> a(size_t(m * k)), b(size_t(k * n)), c(size_t(m * n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 7) * 0.1f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(i % 5) * 0.1f;
  gemm<float>(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n);  // warm up
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    gemm<float>(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
  }
  return 2.0 * double(m) * double(n) * double(k) / best;
}

}  // namespace fsdp::kernels::cpu
