// The math of fsdp.cpp: a forward and a backward function per op. Each checks
// its inputs (shapes, dtypes, devices) and names the bad value, then
// dispatches on device to the CPU or the CUDA backend (src/ops/backend.h: two mirrors, one
// contract).
//
// dtypes: f32 and f64 compute as themselves; bf16 and f16 are storage types,
// widened to f32 for the math and narrowed back for the output.
// Gradient convention: a backward returns the gradient of its input and ADDS
// into the gradients of its parameters (dw, db), so gradient accumulation is
// free and callers zero parameter gradients once per step.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "fsdp/core/ignore_index.h"
#include "fsdp/core/tensor.h"
#include "fsdp/ops/rope.h"

namespace fsdp::ops {

// C = alpha * op(A) op(B) + beta * C for 2-D tensors (op = transpose when asked).
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
          double alpha = 1.0, double beta = 0.0);
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// y = x w^T + b over the last dim of x. b may be undefined (no bias).
Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b);
// Returns dx; adds dy^T x into dw and the row sum of dy into db (if defined).
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dw,
                       const Tensor& db);

// y[..., :] = w[ids[...], :]; ids are i32 or i64 and must be in [0, vocab).
Tensor embedding_forward(const Tensor& ids, const Tensor& w);
void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dw);

// nn.RMSNorm's default eps: the machine epsilon of the compute dtype.
double default_rmsnorm_eps(DType dtype);
struct RMSNormOut {
  Tensor y, rstd;  // rstd: one per row, saved for the backward
};
// y = x * rstd * (w + w_offset): w_offset 1 is Gemma's RMSNorm, (1 + w) with w initialised to 0,
// the sum taken in the compute dtype (f32 for bf16 weights, as Gemma's f32 (1.0 + w.float())).
// The weight's gradient is the same for either offset.
RMSNormOut rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, double w_offset = 0.0);
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        const Tensor& dw, double w_offset = 0.0);

Tensor silu_forward(const Tensor& x);
Tensor silu_backward(const Tensor& dy, const Tensor& x);
// The gated FFN's activation: act(gate) * up, SwiGLU with silu (llama) or GeGLU with gelu's tanh
// form, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (Gemma's gelu_pytorch_tanh).
enum class Gate : uint8_t { silu, gelu_tanh };
Tensor swiglu_forward(const Tensor& gate, const Tensor& up, Gate act = Gate::silu);
std::pair<Tensor, Tensor> swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up,
                                          Gate act = Gate::silu);

// The packed qkv of attention: [B, T, (heads + 2 * kv_heads) * hd], each row the query heads,
// then the key heads, then the value heads, head by head. kv_heads = 0 means kv_heads = heads
// (multi-head attention, nn.MultiheadAttention's [B, T, 3d]); fewer kv heads that divide heads
// is grouped-query attention (1: multi-query): query head h uses kv head h / (heads / kv_heads),
// as Hugging Face's repeat_kv.

// Packed rows: doc_start [B, T] i32, on the tensors' device, gives each token the position in its
// row where its document begins (doc_start[b, t] <= t, and either t or doc_start[b, t - 1]:
// documents are contiguous). Undefined: one document per row. A packed row's documents never see
// each other: attention is causal within each, and rotary positions restart at 0 in each.
// check_doc_start() throws, naming the row and position, for a host tensor that breaks the
// rule (the ops check host tensors; a device tensor is the caller's to check before upload).
void check_doc_start(const Tensor& doc_start, int64_t B, int64_t T);

// Rotary embedding, in place, on the q and k parts of a packed qkv, at rope's frequencies (a
// theta, or a theta with Llama 3's scaling: fsdp/ops/rope.h).
// inverse = true is the backward (the transpose rotation). Token t is at position offset + t,
// or with doc_start at t - doc_start[b, t] (offset must then be 0).
void rope_(const Tensor& qkv, int64_t heads, const Rope& rope, bool inverse, int64_t offset = 0,
           int64_t kv_heads = 0, const Tensor& doc_start = Tensor());

// Scaled dot-product attention over a packed qkv -> [B, T, heads * hd]. With doc_start (causal
// only) each query sees the keys of its own document up to itself, and the kernels skip the
// blocks outside every document. window > 0 (causal only; 0: none) is a sliding window, as
// Hugging Face's sliding_window: query t sees keys t - window + 1 .. t, and the kernels skip the
// blocks before it.
struct AttentionOut {
  Tensor out, lse;  // lse [B, H, T]: row log-sum-exp, saved for the backward
};
AttentionOut attention_forward(const Tensor& qkv, int64_t heads, bool causal, int64_t kv_heads = 0,
                               const Tensor& doc_start = Tensor(), int64_t window = 0);
// dqkv in qkv's layout; the key and value gradients sum over the query heads of each group.
Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int64_t heads, bool causal, int64_t kv_heads = 0,
                          const Tensor& doc_start = Tensor(), int64_t window = 0);

// One step of generation over a KV cache: q [n, heads * hd] holds the queries of positions
// past .. past+n-1 (rotary already applied), k and v [past+n, kv_heads * hd] every key and value
// so far (these included; kv_heads = k's width / hd, dividing heads); each query attends causally.
// Returns [n, heads * hd] in q's dtype. Inference only: there is no backward. window > 0: a
// sliding window, as attention_forward's (query past + i sees no key before past + i - window + 1).
Tensor attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads,
                        int64_t past, int64_t window = 0);

Tensor add(const Tensor& a, const Tensor& b);
void add_(const Tensor& a, const Tensor& b);  // a += b
double sum_squares(const Tensor& x);          // reads the result on the host (a sync on CUDA)
// acc[0] += sum of x^2, where x lives: acc is one f64 on x's device. No sync.
void sum_squares_into(const Tensor& x, const Tensor& acc);
void scale_(const Tensor& x, double s);  // x *= s
// x *= max_norm / (sqrt(total_sq[0]) + 1e-6) where that is below 1; total_sq is one f64 on x's
// device and is read there (clipping without a host round trip).
void clip_scale_(const Tensor& x, const Tensor& total_sq, double max_norm);

// Cross-entropy of logits [N, V] against targets [N] (i32/i64 in [0, V), or kIgnoreIndex): the
// sum over the rows whose target is not ignored, divided by `divisor` (0: by N, the mean over
// rows). An ignored row adds nothing to the loss and gets a zero gradient row. A trainer that
// masks targets passes the number of targets it averages over, across ranks and microbatches
// (train_step does), which PyTorch's ignore_index with reduction="sum" and one division gives.
struct CrossEntropyOut {
  double loss;         // NaN when read_loss is false
  Tensor lse;          // [N]
  Tensor loss_tensor;  // the loss as one f64 on the logits' device
};
// read_loss = false leaves the loss on the device (loss_tensor), so a CUDA step need not wait
// for its forward to finish: read it once, when it is printed.
CrossEntropyOut cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                      bool read_loss = true, double divisor = 0);
// dlogits = (softmax - onehot) * dloss / divisor, zero on ignored rows.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              double dloss = 1.0, double divisor = 0);
// The same, written over the logits (llm.c's trick: [N, V] logits are the largest activation of
// a language model, and their gradient needs no second buffer). logits must be contiguous;
// returns them, now holding dlogits.
Tensor cross_entropy_backward_(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                               double dloss = 1.0, double divisor = 0);

// FSDP's copy kernel: for each segment, dst[dst_offset, +count) = src[src_offset, +count)
// on flat contiguous buffers, casting the dtype. One launch on CUDA for all
// segments: the all-gather copy-out and the reduce-scatter chunk-cat.
struct Segment {
  int64_t dst_offset, src_offset, count;
};
void copy_segments(const Tensor& dst, const Tensor& src, const std::vector<Segment>& segments);

// A mixture of experts' combine (nn::MoE). Token t's k choices i = t k + j (j = 0 .. k-1) sit at
// rows pos[i] of the expert outputs `rows` [R, d]; pos is i64 [N k] on the rows' device, each in
// [0, R). Returns [N, d]:
//   out[t] = base[t] + sum_j weight[i] rows[pos[i]],
// summed in f64 in the order j = 0 .. k-1 and rounded to the rows' dtype (on the CPU bf16 and f16
// through f32, as Tensor::to narrows f64). weight (f64 [N k],
// on the rows' device) undefined: every weight is 1; base ([N, d] in the rows' dtype) undefined:
// 0. A token's result depends on its own k rows only, not on the batch or the world size.
// The CPU reads pos on the host and refuses a row outside [0, R); CUDA, which does not read back,
// writes NaN for that token instead.
Tensor moe_combine(const Tensor& rows, const Tensor& pos, const Tensor& weight, const Tensor& base,
                   int64_t k);
// moe_combine's backward for rows and weight, given dout [N, d] (base's gradient is dout itself):
// drows[pos[i]] = weight[i] dout[t] in the rows' dtype (a row pos does not name is 0), and
// dweight[i] = <dout[t], rows[pos[i]]>, f64 [N k], summed in f64 over the d columns in order
// (the CPU; CUDA sums in f64 in a tree). weight undefined: 1 (dweight is still returned).
struct MoECombineGrad {
  Tensor drows, dweight;
};
MoECombineGrad moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& pos,
                                    const Tensor& weight, int64_t k);

// One AdamW step in place over flat, contiguous buffers of one dtype.
struct AdamWHyper {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};
void adamw_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
            const Tensor& exp_avg_sq, const AdamWHyper& h, int64_t step);

// The buffers of one tensor's AdamW update, each flat and contiguous, of one dtype and length.
struct AdamWTensors {
  Tensor param, grad, exp_avg, exp_avg_sq;
  double weight_decay = 0;
};
// Global-norm clipping applied as the gradients are read (clip_scale_'s rule and rounding:
// scaled by max_norm / (sqrt(total_sq) + 1e-6) where that is below 1; the factor is read on the
// device). total_sq undefined or max_norm <= 0: no clipping.
struct GradClip {
  Tensor total_sq;
  double max_norm = 0;
};
// One AdamW step over many tensors of one dtype and device in one pass (one OpenMP region on
// the CPU, one launch per 48 tensors on CUDA), each with its own weight decay (h.weight_decay is
// not read): bit for bit clip_scale_ over every gradient, then adamw_ over each tensor, with
// each gradient read once and left unscaled.
void adamw_multi_(const std::vector<AdamWTensors>& ts, const AdamWHyper& h, int64_t step,
                  const GradClip& clip = {});

}  // namespace fsdp::ops
