// GEMM through the CPU BLAS library the build chose (cmake/blas.cmake: MKL, OpenBLAS, PyPI's
// scipy-openblas or BLIS, by measurement). Row-major throughout. The sgemm peak measured here is
// the ceiling that fsdp-train's MFU is measured against.
//
// Threads: MKL (GNU threading layer) and Debian's OpenBLAS (OpenMP build) run on our OpenMP pool
// and follow omp_set_num_threads; inside an omp parallel region they run on the calling thread.
// BLIS and scipy-openblas (pthreads) keep their own count, read from the environment once: a GEMM
// called outside a parallel region hands them the OpenMP thread count first, so that --threads
// and OMP_NUM_THREADS hold. Inside one the count is left as it is: BLIS's nested OpenMP region
// runs on one thread, but scipy-openblas's pool is its own and runs beside ours (its 2-thread
// steps in bench/results/gemm-libs-step-cpu.md), one reason the build prefers the others.
#if defined(FSDP_BLAS_MKL)
#include <mkl_cblas.h>
#include <mkl_service.h>
#elif defined(FSDP_BLAS_BLIS)
#include <blis.h>
#include <cblas.h>
#else
#include <cblas.h>
#endif
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

#if defined(FSDP_BLAS_SCIPY_OPENBLAS)
#define FSDP_CBLAS(name) scipy_cblas_##name
#define FSDP_OPENBLAS(name) scipy_openblas_##name
#else
#define FSDP_CBLAS(name) cblas_##name
#define FSDP_OPENBLAS(name) openblas_##name
#endif

namespace fsdp::kernels::cpu {

namespace {

// The libraries with a thread count of their own (see the top): set it where it changed.
void sync_blas_threads() {
#if defined(FSDP_BLAS_BLIS) || defined(FSDP_BLAS_SCIPY_OPENBLAS)
  static std::atomic<int> current{-1};
  if (omp_in_parallel())
    return;  // set from outside any region only (the library's count is global)
  const int want = omp_get_max_threads();
  if (current.exchange(want) == want) return;
#if defined(FSDP_BLAS_BLIS)
  bli_thread_set_num_threads(want);
#else
  scipy_openblas_set_num_threads(want);
#endif
#endif
}

}  // namespace

template <>
void gemm<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  sync_blas_threads();
  FSDP_CBLAS(sgemm)
  (CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n),
   int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

template <>
void gemm<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  sync_blas_threads();
  FSDP_CBLAS(dgemm)
  (CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n),
   int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

const char* blas_library() {
#if defined(FSDP_BLAS_MKL)
  return "mkl";
#elif defined(FSDP_BLAS_BLIS)
  return "blis";
#elif defined(FSDP_BLAS_SCIPY_OPENBLAS)
  return "scipy-openblas";
#else
  return "openblas";
#endif
}

const char* blas_core_name() {
#if defined(FSDP_BLAS_MKL)
  // The code path MKL's automatic choice takes on this CPU (mkl_types.h's MKL_CBWR_*).
  switch (mkl_cbwr_get_auto_branch()) {
    case MKL_CBWR_AVX2:
      return "AVX2";
    case MKL_CBWR_AVX512:
      return "AVX512";
    case MKL_CBWR_AVX512_E1:
      return "AVX512_E1";
#ifdef MKL_CBWR_AVX10  // newer oneMKL releases only
    case MKL_CBWR_AVX10:
      return "AVX10";
#endif
    default:
      return "generic";
  }
#elif defined(FSDP_BLAS_BLIS)
  return bli_arch_string(bli_arch_query_id());
#else
  return FSDP_OPENBLAS(get_corename)();
#endif
}

std::string blas_version() {
#if defined(FSDP_BLAS_MKL)
  MKLVersion v;
  mkl_get_version(&v);
  return std::to_string(v.MajorVersion) + "." + std::to_string(v.UpdateVersion);
#elif defined(FSDP_BLAS_BLIS)
  return bli_info_get_version_str();
#else
  // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64": the version.
  const std::string config = FSDP_OPENBLAS(get_config)();
  const size_t at = config.find(' ');
  return at == std::string::npos ? config
                                 : config.substr(at + 1, config.find(' ', at + 1) - at - 1);
#endif
}

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
