// The CPU kernels, one family per file in kernels/cpu/, each the mirror of a
// file in kernels/cuda/. They take validated, contiguous tensors (the ops
// layer checks shapes and dtypes first) and compute in T = float or double.
// Backward kernels that produce parameter gradients ADD into them (the
// explicit-backward convention of nn/module.h); input gradients are written.
// Private to the library.
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/core/ignore_index.h"
#include "fsdp/core/tensor.h"

namespace fsdp::kernels::cpu {

// gemm.cpp: C[m,n] = alpha * op(A) op(B) + beta * C, row-major, through the BLAS library the
// build chose (cmake/blas.cmake).
template <class T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc);
// The best sgemm FLOP/s of `repeats` timed [m, k] x [k, n] products (after one warm-up) with
// the current threads.
double measure_sgemm_flops(int64_t m, int64_t n, int64_t k, int repeats);
// The library, as FSDP_BLAS names it: "mkl", "openblas", "scipy-openblas" or "blis".
const char* blas_library();
// Its version ("0.3.21", "0.9.0", "2026.2").
std::string blas_version();
// The kernels it runs on this CPU, as it names them: OpenBLAS's core ("SkylakeX", "Prescott",
// chosen when it loaded), BLIS's configuration ("zen3"), MKL's processor path.
const char* blas_core_name();

// gemm_bf16.cpp: C[m,n] = alpha * op(A) op(B) + beta * C for bf16 A and B (their bits, uint16)
// and f32 C, accumulated in f32 with AVX512_BF16's dot products (has_bf16_gemm: this CPU has
// them; gemm_bf16 must not be called where it has not). beta 0 never reads C.
bool has_bf16_gemm();
// Which instructions gemm_bf16 runs on: AVX512_BF16's VDPBF16PS, or AMX's TDPBF16PS tiles where
// the CPU has them and Linux grants this process their state (has_amx_bf16). Unset, the
// fastest there is; set_bf16_gemm_engine refuses amx where has_amx_bf16() is false. The products
// are exact and the sums f32 on both, in different orders.
enum class Bf16Engine { avx512, amx };
bool has_amx_bf16();
void set_bf16_gemm_engine(Bf16Engine e);
Bf16Engine bf16_gemm_engine();
void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);

// elementwise.cpp
template <class T>
void add(const T* a, const T* b, T* out, int64_t n);
template <class T>
void add_inplace(T* a, const T* b, int64_t n);
template <class T>
void bias_add_rows(T* y, const T* bias, int64_t rows, int64_t cols);
template <class T>
void sum_rows_into(const T* dy, T* db, int64_t rows, int64_t cols);  // db += sum_r dy[r]
template <class T>
double sum_squares(const T* x, int64_t n);
template <class T>
void scale(T* x, T s, int64_t n);

// activation.cpp
template <class T>
void silu_forward(const T* x, T* y, int64_t n);
template <class T>
void silu_backward(const T* dy, const T* x, T* dx, int64_t n);
// gelu: GeGLU, gelu's tanh form in place of silu.
template <class T>
void swiglu_forward(const T* gate, const T* up, T* y, int64_t n, bool gelu = false);
template <class T>
void swiglu_backward(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n,
                     bool gelu = false);

// embedding.cpp: ids are int32 or int64 (I).
template <class T, class I>
void embedding_forward(const I* ids, const T* w, T* y, int64_t n, int64_t dim);
template <class T, class I>
void embedding_backward(const I* ids, const T* dy, T* dw, int64_t n, int64_t dim);

// rmsnorm.cpp: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps), per row.
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t dim, double eps);
template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw,
                      int64_t rows, int64_t dim);

// rope.cpp: rotates the q and k parts of a packed qkv [B, T, H + 2 KV, hd] (H query heads, KV
// key heads, KV value heads) in place, half-split pairs (i, i + hd/2) as Hugging Face's
// rotate_half does, pair i at position p by the angle p * freqs[i] (hd / 2 frequencies). inverse =
// true applies the transpose rotation (the backward). Token t of row b is at position t + offset,
// or with doc_start [B, T] (packed rows) t - doc_start[b, t]: each document's positions start at 0.
template <class T>
void rope_qkv(T* qkv, int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t hd, const double* freqs,
              bool inverse, int64_t offset = 0, const int32_t* doc_start = nullptr);

// attention.cpp: out = softmax(q k^T / sqrt(hd) [+ causal mask]) v per (b, h) from a packed
// qkv [B, T, (H + 2 KV) hd]; query head h reads kv head h / (H / KV) (grouped-query attention;
// KV = H is multi-head). out is [B, T, H hd]. lse [B, H, T] keeps each row's log-sum-exp, so
// the backward recomputes the probabilities instead of storing B*H*T*T of them; its dk and dv
// sum over the query heads of each group. doc_start [B, T] (null: one document per row; causal
// only) is the first position of each token's document in its row: query t sees keys
// doc_start[b, t] .. t, and the tiles skip every key outside its document. window > 0 (causal
// only): query t sees no key before t - window + 1 either.
template <class T>
void attention_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t T_, int64_t H, int64_t KV,
                       int64_t hd, bool causal, const int32_t* doc_start = nullptr,
                       int64_t window = 0);
template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv, int64_t B,
                        int64_t T_, int64_t H, int64_t KV, int64_t hd, bool causal,
                        const int32_t* doc_start = nullptr, int64_t window = 0);

// The bytes of scratch attention_forward (backward: attention_backward) holds while it runs, over
// this process's OpenMP threads, for sequences of T_ and elements of elem_bytes: the memory plan's
// meta backend counts them.
int64_t attention_scratch_bytes(bool backward, int64_t T_, int64_t elem_bytes);

// attention.cpp: one decode step over a KV cache. q [n, H*hd] holds the queries at positions
// past .. past+n-1, k and v [past+n, KV*hd] every key and value so far; query i attends to keys
// 0 .. past+i (a window > 0: from past+i-window+1), query head h to kv head h / (H / KV).
// out [n, H*hd].
template <class T>
void attention_decode(const T* q, const T* k, const T* v, T* out, int64_t n, int64_t H, int64_t KV,
                      int64_t hd, int64_t past, int64_t window = 0);

// softmax_xent.cpp: cross-entropy over n rows of v logits, summed over the rows whose target is
// not kIgnoreIndex (fsdp/ops/ops.h) and divided by divisor.
template <class T, class I>
double softmax_xent_forward(const T* logits, const I* targets, T* lse, int64_t n, int64_t v,
                            double divisor);
template <class T, class I>
void softmax_xent_backward(const T* logits, const I* targets, const T* lse, T* dlogits,
                           double dloss, double divisor, int64_t n, int64_t v);

// adamw.cpp: one fused AdamW step over many flat buffers at once, PyTorch's semantics.
struct AdamWArgs {
  double lr, beta1, beta2, eps;
  int64_t step;  // 1-based, after the increment
};
template <class T>
struct AdamWSpan {
  T* param;
  const T* grad;
  T* m;
  T* v;
  int64_t n;
  double weight_decay;
};
// grad_scale: the clipping factor each gradient is multiplied by (rounded to T) as it is read,
// or 1 for none.
template <class T>
void adamw_multi(const AdamWSpan<T>* spans, int64_t count, const AdamWArgs& a, T grad_scale);

// moe.cpp: a mixture of experts' combine, out[t] = base[t] + sum_j weight[t k + j] rows[pos[..]]
// in f64 (base, weight null: 0, 1), and its backward: drows[pos[i]] = weight[i] dout[t],
// dweight[i] = <dout[t], rows[pos[i]]>. pos in [0, R), each row named at most once.
template <class T>
void moe_combine(const T* rows, const int64_t* pos, const double* weight, const T* base, T* out,
                 int64_t n, int64_t k, int64_t d);
template <class T>
void moe_combine_backward(const T* dout, const T* rows, const int64_t* pos, const double* weight,
                          T* drows, double* dweight, int64_t n, int64_t k, int64_t d);

}  // namespace fsdp::kernels::cpu
