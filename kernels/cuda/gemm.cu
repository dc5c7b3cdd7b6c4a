// GEMM through cuBLASLt. Row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T, so no data moves. bf16 and f16 inputs
// accumulate in f32; f32 uses TF32 tensor cores only when FSDP_CUDA_TF32=1.
// The bias of Linear is cuBLASLt's BIAS epilogue, and its gradient the
// BGRADB epilogue of the dW GEMM (no separate pass over dY). C may be f32
// under bf16/f16 inputs, so dW accumulates straight into an f32 gradient
// (beta = 1: no bf16 temporary, no extra add). Per (shape, transposes, dtypes,
// epilogue), the first call times the heuristic's FSDP_GEMM_TUNE best
// candidates on its own operands and keeps the fastest; after the first step
// no heuristic query or trial runs.
//
// Alignment: cuBLASLt's heuristic assumes 256-byte-aligned A, B, C and D unless told otherwise, and
// may then pick a kernel whose vector loads fault (or read wrongly) on a view at an odd offset.
// Each call tells it the real alignment of every pointer (the largest power of two dividing the
// address, capped at 256) and a plan is cached per alignment too, so a plan chosen for aligned
// pointers never runs on unaligned ones. The bias epilogues' vector has no such preference: where
// it is under 16-byte aligned the epilogue is not used (BIAS: the plain GEMM, then a kernel adds
// the bias; BGRADB: gemm_bgrad returns false and the caller sums the rows), as PyTorch does.
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

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
  int device = 0;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// Leaked on purpose (never destroyed), as the plan cache below: a static map would destroy its
// cuBLASLt handles at exit, after the CUDA runtime may already be torn down, and a destructor
// there would call into a dead driver. tests/static_resources_test.sh holds every object of the
// library that calls cuBLASLt, cuDNN, NCCL or CUDA to this (no __cxa_atexit).
DeviceCtx& ctx(int device) {
  static std::mutex mu;  // trivially destructible
  static auto* all = new std::map<int, DeviceCtx>;
  std::lock_guard<std::mutex> lock(mu);
  DeviceCtx& c = (*all)[device];
  if (!c.handle) {
    c.device = device;
    CUBLAS_CHECK(cublasLtCreate(&c.handle));
    // From the caching allocator, as PyTorch's cuBLAS workspace, so peak memory counts it.
    c.workspace = allocator_for(Device::cuda(device)).allocate(kWorkspace);
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

enum class Epilogue { none, bias, bgrad };
// (device, m, n, k, ta, tb, A/B dtype, C dtype, epilogue, and the byte alignments of cuBLAS's
// A (our B), cuBLAS's B (our A) and C = D).
using Key = std::tuple<int, int64_t, int64_t, int64_t, bool, bool, int, int, Epilogue, uint32_t,
                       uint32_t, uint32_t>;

// The largest power of two that divides the address, capped at 256 (cuBLASLt's default
// assumption); 256 for a null pointer.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  return uint32_t(std::min<uintptr_t>(a & (~a + 1), 256));
}

// The bias epilogues read (BIAS) or write (BGRADB) their vector with vector accesses that no
// preference covers: under this alignment the epilogue is not used.
constexpr uint32_t kEpilogueAlignment = 16;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's best first
  cublasLtMatmulAlgo_t algo{};
  bool tuned = false;
  bool refused = false;  // no candidate ran (an epilogue cuBLASLt offers but cannot run here)
};

std::mutex plan_mu;

// The plan of a shape, or nullptr where cuBLASLt has no algorithm for it (only an epilogue
// other than none may be refused; the caller then does without it).
Plan* plan_for(const Key& key, DeviceCtx& dc) {
  // Leaked on purpose: its plans own cuBLASLt descriptors (see ctx()).
  static auto* cache = new std::map<Key, std::unique_ptr<Plan>>;
  std::lock_guard<std::mutex> lock(plan_mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second.get();
  auto [device, m, n, k, ta, tb, dt, ct, epilogue, align_a, align_b, align_c] = key;
  const DType t = DType(dt), c_t = DType(ct);
  const cudaDataType_t type = cuda_type(t), c_type = cuda_type(c_t);
  const cublasComputeType_t compute = t == DType::f32 && env_str("FSDP_CUDA_TF32") == "1"
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  auto p = std::make_unique<Plan>();
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F));
  // cuBLAS's A is our B and its B our A (see the file comment).
  const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                          op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (epilogue != Epilogue::none) {
    // BIAS adds our [n] bias to every row. BGRADB writes the sums over k of cuBLAS's B, which
    // is our op(A): bgrad[i] = sum_k op(A)[i, k], the bias gradient of dW = dY^T X. The bias
    // vector has C's dtype.
    const cublasLtEpilogue_t epi =
        epilogue == Epilogue::bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADB;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c_type,
                                                sizeof(c_type)));
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, type, tb ? k : n, tb ? n : k, tb ? k : n));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, type, ta ? m : k, ta ? k : m, ta ? m : k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, c_type, n, m, n));
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &kWorkspace, sizeof(kWorkspace)));
  // The real alignments (cuBLAS's A is our B); C and D are the same buffer.
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
  const int want = std::max(1, int(env_double("FSDP_GEMM_TUNE")));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(want));
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(dc.handle, p->op, p->a, p->b, p->c, p->c,
                                                           pref, want, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (epilogue != Epilogue::bgrad) {
    CUBLAS_CHECK(st);
    FSDP_CHECK(found > 0, "[gemm] cuBLASLt has no algorithm for [{} x {}] x [{} x {}] in {} -> {}",
               m, k, k, n, dtype_name(t), dtype_name(c_t));
  }
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    cache->emplace(key, nullptr);
    return nullptr;
  }
  for (int i = 0; i < found; ++i)
    if (results[size_t(i)].state == CUBLAS_STATUS_SUCCESS)
      p->candidates.push_back(results[size_t(i)].algo);
  if (p->candidates.empty()) {
    FSDP_CHECK(epilogue == Epilogue::bgrad,
               "[gemm] cuBLASLt offers no usable algorithm for [{} x {}] x [{} x {}] in {} -> {}",
               m, k, k, n, dtype_name(t), dtype_name(c_t));
    cache->emplace(key, nullptr);
    return nullptr;
  }
  p->algo = p->candidates.front();
  return cache->emplace(key, std::move(p)).first->second.get();
}

float elapsed_ms(cudaEvent_t e0, cudaEvent_t e1) {
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  return ms;
}

// Times each candidate on this call's own operands, once per shape, and keeps the fastest: the
// heuristic's first choice is often not cuBLAS's fastest kernel for a shape. The call's C is
// not touched: where beta != 0 (C is read), the trials write a scratch C instead. A candidate
// that fails to launch is skipped; when none runs, the plan is refused.
void tune(Plan& p, DeviceCtx& dc, int64_t m, int64_t n, DType c_t, float alpha, const void* a,
          const void* b, float beta, void* c, Epilogue epilogue, void* bias, cudaStream_t s) {
  std::optional<Scratch> scratch_c, scratch_bias;
  if (beta != 0.f) scratch_c.emplace(size_t(m * n) * dtype_size(c_t), dc.device);
  void* d = scratch_c ? scratch_c->as<void>() : c;
  // BIAS only reads its vector; BGRAD writes one, so the trials write a scratch vector.
  if (epilogue == Epilogue::bgrad) scratch_bias.emplace(size_t(m) * dtype_size(c_t), dc.device);
  void* trial_bias = scratch_bias ? scratch_bias->as<void>() : bias;
  if (epilogue != Epilogue::none)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &trial_bias, sizeof(trial_bias)));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  float best = 0;
  for (const cublasLtMatmulAlgo_t& algo : p.candidates) {
    auto run = [&] {
      return cublasLtMatmul(dc.handle, p.op, &alpha, b, p.a, a, p.b, &beta, d, p.c, d, p.c, &algo,
                            dc.workspace, kWorkspace, s);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate that cannot run is skipped
    CUDA_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < 3; ++i) CUBLAS_CHECK(run());
    CUDA_CHECK(cudaEventRecord(e1, s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    const float ms = elapsed_ms(e0, e1);
    if (best == 0 || ms < best) {
      best = ms;
      p.algo = algo;
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  p.tuned = true;
  p.refused = best == 0;
}

bool launch(const GemmArgs& g, Epilogue epilogue, void* bias, Stream s) {
  if (g.m == 0 || g.n == 0) return true;
  CUDA_CHECK(cudaSetDevice(g.device));
  DeviceCtx& dc = ctx(g.device);
  const DType c_t = g.c_t.value_or(g.t);
  Plan* p = plan_for(Key{g.device, g.m, g.n, g.k, g.ta, g.tb, int(g.t), int(c_t), epilogue,
                         alignment(g.b), alignment(g.a), alignment(g.c)},
                     dc);
  if (!p) return false;
  std::lock_guard<std::mutex> lock(plan_mu);  // the descriptor's bias pointer is per call
  if (!p->tuned)
    tune(*p, dc, g.m, g.n, c_t, g.alpha, g.a, g.b, g.beta, g.c, epilogue, bias, cudaStream_t(s));
  if (p->refused) {
    FSDP_CHECK(epilogue == Epilogue::bgrad,
               "[gemm] no cuBLASLt candidate ran for [{} x {}] x [{} x {}] in {} -> {}", g.m, g.k,
               g.k, g.n, dtype_name(g.t), dtype_name(c_t));
    return false;
  }
  if (bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
  CUBLAS_CHECK(cublasLtMatmul(dc.handle, p->op, &g.alpha, g.b, p->a, g.a, p->b, &g.beta, g.c, p->c,
                              g.c, p->c, &p->algo, dc.workspace, kWorkspace, cudaStream_t(s)));
  return true;
}

}  // namespace

void gemm(const GemmArgs& g, Stream s) {
  if (g.bias && alignment(g.bias) < kEpilogueAlignment) {
    // An under-aligned bias (a view at an odd offset): the plain GEMM, then the bias added.
    launch(g, Epilogue::none, nullptr, s);
    add_bias_rows(g.c, g.c_t.value_or(g.t), g.bias, g.m, g.n, g.device, s);
    return;
  }
  launch(g, g.bias ? Epilogue::bias : Epilogue::none, const_cast<void*>(g.bias), s);
}

bool gemm_bgrad(const GemmArgs& g, void* bgrad, Stream s) {
  if (alignment(bgrad) < kEpilogueAlignment) return false;  // the caller sums the rows
  return launch(g, Epilogue::bgrad, bgrad, s);
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
          const void* b, float beta, void* c, DType t, const void* bias, int device, Stream s) {
  GemmArgs g;
  g.ta = ta, g.tb = tb;
  g.m = m, g.n = n, g.k = k;
  g.alpha = alpha, g.beta = beta;
  g.a = a, g.b = b, g.c = c;
  g.t = t;
  g.bias = bias;
  g.device = device;
  gemm(g, s);
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
  // Random operands: on constant data the tensor cores switch fewer bits and draw less
  // power, and the same GEMM ran 900 TFLOP/s there against 700-790 on random data.
  fill_uniform(a, t, n * n, -1.0, 1.0, 1, device, nullptr);
  fill_uniform(b, t, n * n, -1.0, 1.0, 2, device, nullptr);
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
