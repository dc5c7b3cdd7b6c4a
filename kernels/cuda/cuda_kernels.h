// Host-side launchers of the CUDA kernels. This header includes no device
// code and no CUDA header, so host files can include it freely. Every
// launcher takes the stream explicitly (the ops pass the device's compute
// stream, fsdp::cuda_compute_stream; never the legacy default stream) and works on contiguous
// buffers of one storage dtype: f32, bf16 or f16, accumulating in f32 (f64 where noted). Backward
// launchers that produce parameter gradients ADD into them, like the CPU kernels. Private to the
// library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"

namespace fsdp::kernels::cuda {

using Stream = void*;

// cast.cu: random fills and FSDP's copy kernels (plain casts and fills: core's gpu::cast, fill).
// Uniform in [lo, hi), a counter-based hash of (seed, index): the same values on every call.
void fill_uniform(void* dst, DType t, int64_t n, double lo, double hi, uint64_t seed, int device,
                  Stream s);
// One launch for many contiguous segments: dst[dst_off[i] ..] = cast(src[src_off[i] ..]) for
// count[i] elements. FSDP's all-gather copy-out and reduce-scatter chunk-cat are this.
void copy_segments(void* dst, DType dst_t, const void* src, DType src_t, const int64_t* dst_off,
                   const int64_t* src_off, const int64_t* count, int64_t segments, int device,
                   Stream s);

// moe.cu: a mixture of experts' combine and its backward (fsdp::ops::moe_combine): f64 sums, one
// rounding to t (f32, bf16 or f16); pos i64 and weight f64 (or null: ones) on the device.
void moe_combine(const void* rows, const int64_t* pos, const double* weight, const void* base,
                 void* out, DType t, int64_t R, int64_t n, int64_t k, int64_t d, int device,
                 Stream s);
void moe_combine_backward(const void* dout, const void* rows, const int64_t* pos,
                          const double* weight, void* drows, double* dweight, DType t, int64_t R,
                          int64_t n, int64_t k, int64_t d, int device, Stream s);

// elementwise.cu
void add(const void* a, const void* b, void* out, DType t, int64_t n, int device, Stream s);
void add_inplace(void* a, DType at, const void* b, DType bt, int64_t n, int device, Stream s);
void scale(void* x, DType t, double v, int64_t n, int device, Stream s);
// acc[0] += sum of x^2, on the device (acc: one f64), no sync.
void sum_squares_into(const void* x, DType t, int64_t n, double* acc, int device, Stream s);
// x *= max_norm / (sqrt(total_sq[0]) + 1e-6) where that is below 1, reading total_sq on the
// device: clipping by a global norm that never visits the host.
void clip_scale(void* x, DType t, int64_t n, const double* total_sq, double max_norm, int device,
                Stream s);
// db[c] += sum over the rows of dy[r, c] (dy of dtype t, db of dbt), in f32, deterministically:
// blocks take (row chunk, column tile) pairs of sum_rows_plan, then the chunks' partial sums are
// added in chunk order (no atomics).
void sum_rows_into(const void* dy, DType t, void* db, DType dbt, int64_t rows, int64_t cols,
                   int device, Stream s);
struct SumRowsPlan {
  int64_t col_tiles = 1;  // of 32 columns
  int64_t chunks = 1;     // row chunks: chunk rows each, the last one possibly shorter
  int64_t chunk = 1;
};
SumRowsPlan sum_rows_plan(int64_t rows, int64_t cols);
// y[r, c] += bias[c] for a row-major [rows, cols] y (bias of y's dtype t).
void add_bias_rows(void* y, DType t, const void* bias, int64_t rows, int64_t cols, int device,
                   Stream s);

// gemm.cu: row-major C[m,n] = alpha op(A) op(B) + beta C through cuBLASLt, f32 accumulation
// (f32 inputs may use TF32 when FSDP_CUDA_TF32=1). bias (optional, [n], dtype t) is the epilogue.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
          const void* b, float beta, void* c, DType t, const void* bias, int device, Stream s);
struct GemmArgs {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.f, beta = 0.f;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  DType t = DType::f32;        // A and B
  std::optional<DType> c_t;    // C: t by default; f32 under bf16/f16 A and B
  const void* bias = nullptr;  // [n] of C's dtype, added to each row (the BIAS epilogue)
  int device = 0;
};
void gemm(const GemmArgs& g, Stream s);
// The same, and bgrad[i] = sum_k op(A)[i, k] ([m], C's dtype, written, not added) in the
// epilogue: the bias gradient of dW = dY^T X. Returns false, having done nothing, where
// cuBLASLt has no such epilogue for this shape and these dtypes.
bool gemm_bgrad(const GemmArgs& g, void* bgrad, Stream s);
// Best bf16 GEMM FLOP/s on an n x n x n product, and the device-to-device copy GB/s.
double measure_gemm_flops(int64_t n, DType t, int device);
double measure_copy_gbps(int64_t bytes, int device);

// activation.cu
void silu_forward(const void* x, void* y, DType t, int64_t n, int device, Stream s);
void silu_backward(const void* dy, const void* x, void* dx, DType t, int64_t n, int device,
                   Stream s);
// gelu: GeGLU (gelu's tanh form) in place of SwiGLU's silu.
void swiglu_forward(const void* g, const void* u, void* y, DType t, int64_t n, bool gelu,
                    int device, Stream s);
void swiglu_backward(const void* dy, const void* g, const void* u, void* dg, void* du, DType t,
                     int64_t n, bool gelu, int device, Stream s);

// embedding.cu: ids are i32 or i64.
// An id outside [0, vocab) gives a NaN row (forward) and no update (backward).
void embedding_forward(const void* ids, DType idt, const void* w, void* y, DType t, int64_t n,
                       int64_t vocab, int64_t dim, int device, Stream s);
void embedding_backward(const void* ids, DType idt, const void* dy, DType t, void* dw, DType dwt,
                        int64_t n, int64_t vocab, int64_t dim, int device, Stream s);

// rmsnorm.cu: rstd is f32 [rows]; the weight is used as w + w_offset (Gemma: 1), in f32.
void rmsnorm_forward(const void* x, const void* w, void* y, float* rstd, DType t, int64_t rows,
                     int64_t dim, double eps, float w_offset, int device, Stream s);
// dw (optional, dwt) is added into; it needs `rmsnorm_backward_scratch` f32 of scratch.
int64_t rmsnorm_backward_scratch(int64_t rows, int64_t dim, int device);
void rmsnorm_backward(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                      void* dw, DType dwt, float* scratch, DType t, int64_t rows, int64_t dim,
                      float w_offset, int device, Stream s);

// rope.cu: in place on the q and k parts of qkv [B, T, H + 2 KV, hd] (H query heads, KV key
// heads, KV value heads), half-split pairs, pair i by position * freqs[i] (hd / 2 host values, at
// most kMaxRopePairs: they travel as a kernel argument). Positions are offset, offset + 1, ... (a
// KV-cache decode continues where the cache ends), or with doc_start (device i32 [B, T], packed
// rows) t - doc_start[b, t].
constexpr int64_t kMaxRopePairs = 256;
void rope_qkv(void* qkv, DType t, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
              const double* freqs, bool inverse, int64_t offset, const int32_t* doc_start,
              int device, Stream s);

// attention.cu: flash-style; lse is f32 [B, H, T]; no T x T matrix is stored. qkv is
// [B, T, (H + 2 KV) hd]; query head h reads kv head h / (H / KV) (grouped-query attention);
// out and dout are [B, T, H hd]; dk and dv sum over the query heads of their group. doc_start
// (device i32 [B, T], or null; causal only): query t sees keys doc_start[b, t] .. t, and the key
// tiles before a block's first document are skipped. window > 0 (causal): query t sees no key
// before t - window + 1, and the key tiles before a block's window are skipped too.
void attention_forward(const void* qkv, void* out, float* lse, DType t, int64_t B, int64_t T,
                       int64_t H, int64_t KV, int64_t hd, bool causal, const int32_t* doc_start,
                       int64_t window, int device, Stream s);
void attention_backward(const void* dout, const void* qkv, const void* out, const float* lse,
                        void* dqkv, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t hd, bool causal, const int32_t* doc_start, int64_t window,
                        int device, Stream s);

// attention.cu: one decode step over a KV cache, as kernels/cpu's attention_decode (k and v
// [past + n, KV hd]); one block per (query, head), the scores in shared memory (past + n floats).
// window > 0: query past + i reads keys from past + i - window + 1 only.
void attention_decode(const void* q, const void* k, const void* v, void* out, DType t, int64_t n,
                      int64_t H, int64_t KV, int64_t hd, int64_t past, int64_t window, int device,
                      Stream s);
// attention_cudnn.cpp (no_cudnn.cpp in builds without cuDNN, refusing every shape): cuDNN's fused
// SDPA, bf16 and f16, same layouts (grouped-query included) and lse as above. The workspace query
// builds and caches the plan for that shape; it returns the bytes of workspace the call needs, or
// -1 where cuDNN is off (FSDP_CUDNN_ATTENTION=0) or refuses the shape (the refusal says why); then
// the kernel above is the fallback. window > 0 (causal only): query t keeps keys t - window + 1
// .. t, cuDNN's diagonal band.
int64_t cudnn_attention_workspace(bool backward, DType t, int64_t B, int64_t T, int64_t H,
                                  int64_t KV, int64_t hd, bool causal, int64_t window, int device);
// cuDNN's version as major * 10000 + minor * 100 + patch (9.19.0: 91900): the one loaded at run
// time (cudnnGetVersion, no device needed) and the headers' one compiled in (CUDNN_VERSION); 0 in
// a build without cuDNN. cudnn_versions() says both in words, or that the build has no cuDNN.
int64_t cudnn_loaded_version();
int64_t cudnn_built_version();
std::string cudnn_versions();
std::string cudnn_attention_refusal(bool backward, DType t, int64_t B, int64_t T, int64_t H,
                                    int64_t KV, int64_t hd, bool causal, int64_t window,
                                    int device);
void cudnn_attention_forward(const void* qkv, void* out, float* lse, DType t, int64_t B, int64_t T,
                             int64_t H, int64_t KV, int64_t hd, bool causal, int64_t window,
                             void* workspace, int device, Stream s);
void cudnn_attention_backward(const void* dout, const void* qkv, const void* out, const float* lse,
                              void* dqkv, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                              int64_t hd, bool causal, int64_t window, void* workspace, int device,
                              Stream s);

// softmax_xent.cu: lse is f32 [n]; mean_loss (one f64 on the device) gets the loss summed over
// the rows whose target is not kIgnoreIndex, divided by divisor, and stays there: no sync. Any
// other target outside [0, v) makes the loss NaN.
void softmax_xent_forward(const void* logits, const void* targets, DType tt, float* lse,
                          double* mean_loss, DType t, int64_t n, int64_t v, double divisor,
                          int device, Stream s);
// dlogits = (softmax - onehot) * dloss / divisor, zero on an ignored row; may be logits (in place).
void softmax_xent_backward(const void* logits, const void* targets, DType tt, const float* lse,
                           void* dlogits, DType t, double dloss, double divisor, int64_t n,
                           int64_t v, int device, Stream s);

// adamw.cu: one fused step over many flat buffers of dtype t (the master weights), one launch
// per kAdamWTensorsPerLaunch of them. total_sq (a device f64, or null) and max_norm: clipping's
// factor, applied to each gradient as it is read (clip_scale's rounding).
struct AdamWBuffers {
  void* param;
  const void* grad;
  void* m;
  void* v;
  int64_t n;
  double weight_decay;
};
void adamw_multi(const AdamWBuffers* bufs, int64_t count, DType t, double lr, double beta1,
                 double beta2, double eps, int64_t step, const double* total_sq, double max_norm,
                 int device, Stream s);

}  // namespace fsdp::kernels::cuda
