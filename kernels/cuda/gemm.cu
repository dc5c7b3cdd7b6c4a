// GEMM through cuBLASLt. Row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T, so no data moves. bf16 and f16 inputs
// accumulate in f32; f32 uses TF32 tensor cores only when FSDP_CUDA_TF32=1.
// The bias of Linear is cuBLASLt's BIAS epilogue. The heuristic's choice is
// cached per (shape, transposes, dtype, epilogue): after the first step no
// heuristic query runs.
#include <cublasLt.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "fsdp/core/env.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

#define CUBLAS_CHECK(expr)                                           \
  do {                                                               \
    cublasStatus_t st_ = (expr);                                     \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                \
      FSDP_FAIL("[cublasLt] {} failed: status {}", #expr, int(st_)); \
  } while (0)

namespace fsdp::kernels::cuda {

namespace {

constexpr size_t kWorkspace = 32u << 20;

struct DeviceCtx {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

DeviceCtx& ctx(int device) {
  static std::mutex mu;
  static std::map<int, DeviceCtx> all;
  std::lock_guard<std::mutex> lock(mu);
  DeviceCtx& c = all[device];
  if (!c.handle) {
    CUBLAS_CHECK(cublasLtCreate(&c.handle));
    CUDA_CHECK(cudaMalloc(&c.workspace, kWorkspace));
  }
  return c;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      FSDP_FAIL("[gemm] CUDA GEMM takes f32, bf16 or f16, got {}", dtype_name(t));
  }
}

using Key = std::tuple<int, int64_t, int64_t, int64_t, bool, bool, int, bool>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

Plan& plan_for(const Key& key, DeviceCtx& dc) {
  static std::mutex mu;
  static std::map<Key, Plan> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto [device, m, n, k, ta, tb, dt, has_bias] = key;
  const DType t = DType(dt);
  const cudaDataType_t type = cuda_type(t);
  const cublasComputeType_t compute = t == DType::f32 && env_str("FSDP_CUDA_TF32") == "1"
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, compute, CUDA_R_32F));
  // cuBLAS's A is our B and its B our A (see the file comment).
  const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                          op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (has_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type,
                                                sizeof(type)));
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, type, tb ? k : n, tb ? n : k, tb ? k : n));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, type, ta ? m : k, ta ? k : m, ta ? m : k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, type, n, m, n));
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &kWorkspace, sizeof(kWorkspace)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(dc.handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result,
                                              &found));
  cublasLtMatmulPreferenceDestroy(pref);
  FSDP_CHECK(found > 0, "[gemm] cuBLASLt has no algorithm for [{} x {}] x [{} x {}] in {}", m, k, k,
             n, dtype_name(t));
  p.algo = result.algo;
  return cache.emplace(key, p).first->second;
}

}  // namespace

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
          const void* b, float beta, void* c, DType t, const void* bias, int device, Stream s) {
  if (m == 0 || n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  DeviceCtx& dc = ctx(device);
  Plan& p = plan_for(Key{device, m, n, k, ta, tb, int(t), bias != nullptr}, dc);
  if (bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
  CUBLAS_CHECK(cublasLtMatmul(dc.handle, p.op, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c,
                              &p.algo, dc.workspace, kWorkspace, cudaStream_t(s)));
}

namespace {
// Milliseconds per call of `f` over `iters` calls on the default stream, after one warm-up call.
template <class F>
double time_ms(F&& f, int iters) {
  f();
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  CUDA_CHECK(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) f();
  CUDA_CHECK(cudaEventRecord(e1));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return double(ms) / iters;
}
}  // namespace

double measure_gemm_flops(int64_t n, DType t, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  const size_t bytes = size_t(n * n) * dtype_size(t);
  void *a, *b, *c;
  CUDA_CHECK(cudaMalloc(&a, bytes));
  CUDA_CHECK(cudaMalloc(&b, bytes));
  CUDA_CHECK(cudaMalloc(&c, bytes));
  fill(a, t, n * n, 0.01, device, nullptr);
  fill(b, t, n * n, 0.01, device, nullptr);
  const double ms = time_ms(
      [&] { gemm(false, false, n, n, n, 1.f, a, b, 0.f, c, t, nullptr, device, nullptr); }, 20);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3);
}

double measure_copy_gbps(int64_t bytes, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  void *a, *b;
  CUDA_CHECK(cudaMalloc(&a, size_t(bytes)));
  CUDA_CHECK(cudaMalloc(&b, size_t(bytes)));
  CUDA_CHECK(cudaMemset(a, 0, size_t(bytes)));
  const double ms = time_ms(
      [&] { CUDA_CHECK(cudaMemcpyAsync(b, a, size_t(bytes), cudaMemcpyDeviceToDevice)); }, 10);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;  // read + write
}

}  // namespace fsdp::kernels::cuda
