// The backends of fsdp::ops, as mirrors: one list of implementation
// functions, declared alike in cpu_impl (src/ops/cpu_ops.cpp), meta_impl (the same file compiled
// again over kernels that launch nothing: src/ops/meta_ops.cpp) and cuda_impl
// (src/ops/cuda_ops.cpp; in a build without CUDA, src/ops/no_cuda_ops.cpp,
// where every function throws "no CUDA in this build"). ops.cpp checks shapes
// and names the bad value, then calls one of the two; the compiler holds both
// to the whole list.
//
// The contract both keep:
// - inputs of one op share one storage dtype; the output is in that dtype;
// - saved statistics (rmsnorm's rstd, attention's and cross-entropy's lse) are in the compute
//   dtype: f64 for f64 inputs, f32 for f32, bf16 and f16;
// - a backward returns its input's gradient and adds into the parameter gradients it is given;
// - attention's kv_heads is resolved (never 0) and divides heads; cross-entropy's divisor is
//   resolved (the rows when the caller gave none) and a target of kIgnoreIndex adds nothing;
// - a doc_start (packed rows) is undefined or a checked i32 [B, T] on the op's device, and comes
//   with causal attention; so does a sliding window (> 0);
// - nothing reads back to the host except what the op returns as a double.
// Private to the library.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/ops/ops.h"

// X(return type, name, (parameters))
#define FSDP_BACKEND_OPS(X)                                                                       \
  X(void, gemm,                                                                                   \
    (const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,           \
     double beta))                                                                                \
  X(Tensor, linear_forward, (const Tensor& x, const Tensor& w, const Tensor& b))                  \
  X(Tensor, linear_backward,                                                                      \
    (const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dw, const Tensor& db))     \
  X(Tensor, embedding_forward, (const Tensor& ids, const Tensor& w))                              \
  X(void, embedding_backward, (const Tensor& dy, const Tensor& ids, const Tensor& dw))            \
  X(RMSNormOut, rmsnorm_forward, (const Tensor& x, const Tensor& w, double eps, double w_offset)) \
  X(Tensor, rmsnorm_backward,                                                                     \
    (const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dw,    \
     double w_offset))                                                                            \
  X(Tensor, silu_forward, (const Tensor& x))                                                      \
  X(Tensor, silu_backward, (const Tensor& dy, const Tensor& x))                                   \
  X(Tensor, swiglu_forward, (const Tensor& g, const Tensor& u, Gate act))                         \
  X(TensorPair, swiglu_backward, (const Tensor& dy, const Tensor& g, const Tensor& u, Gate act))  \
  X(void, rope_,                                                                                  \
    (const Tensor& qkv, int64_t heads, int64_t kv_heads, const std::vector<double>& freqs,        \
     bool inverse, int64_t offset, const Tensor& doc_start))                                      \
  X(AttentionOut, attention_forward,                                                              \
    (const Tensor& qkv, int64_t heads, int64_t kv_heads, bool causal, const Tensor& doc_start,    \
     int64_t window))                                                                             \
  X(Tensor, attention_backward,                                                                   \
    (const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t heads,  \
     int64_t kv_heads, bool causal, const Tensor& doc_start, int64_t window))                     \
  X(Tensor, attention_decode,                                                                     \
    (const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads, int64_t kv_heads,          \
     int64_t past, int64_t window))                                                               \
  X(Tensor, add, (const Tensor& a, const Tensor& b))                                              \
  X(void, add_, (const Tensor& a, const Tensor& b))                                               \
  X(void, sum_squares_into, (const Tensor& x, const Tensor& acc))                                 \
  X(void, clip_scale_, (const Tensor& x, const Tensor& total_sq, double max_norm))                \
  X(void, scale_, (const Tensor& x, double s))                                                    \
  X(CrossEntropyOut, cross_entropy_forward,                                                       \
    (const Tensor& logits, const Tensor& targets, bool read_loss, double divisor))                \
  X(Tensor, cross_entropy_backward,                                                               \
    (const Tensor& logits, const Tensor& targets, const Tensor& lse, double dloss,                \
     double divisor))                                                                             \
  X(Tensor, cross_entropy_backward_,                                                              \
    (const Tensor& logits, const Tensor& targets, const Tensor& lse, double dloss,                \
     double divisor))                                                                             \
  X(void, copy_segments,                                                                          \
    (const Tensor& dst, const Tensor& src, const std::vector<Segment>& segments))                 \
  X(Tensor, moe_combine,                                                                          \
    (const Tensor& rows, const Tensor& pos, const Tensor& weight, const Tensor& base, int64_t k)) \
  X(MoECombineGrad, moe_combine_backward,                                                         \
    (const Tensor& dout, const Tensor& rows, const Tensor& pos, const Tensor& weight, int64_t k)) \
  X(void, adamw_multi_,                                                                           \
    (const std::vector<AdamWTensors>& ts, const AdamWHyper& h, int64_t step,                      \
     const GradClip& clip))

#define FSDP_DECLARE_BACKEND_OP(ret, name, params) ret name params;
#define FSDP_BACKEND_OP_NAME(ret, name, params) #name,

namespace fsdp::ops {

// The list's names: ops_test fails when one has no case in the op-case table (tests/op_cases.h).
inline constexpr const char* kBackendOpNames[] = {FSDP_BACKEND_OPS(FSDP_BACKEND_OP_NAME)};

using TensorPair = std::pair<Tensor, Tensor>;

namespace cpu_impl {
FSDP_BACKEND_OPS(FSDP_DECLARE_BACKEND_OP)
}  // namespace cpu_impl

// The meta backend (src/ops/meta_ops.cpp): cpu_impl's code over kernels that launch nothing, on
// meta tensors (fsdp/core/meta.h).
namespace meta_impl {
FSDP_BACKEND_OPS(FSDP_DECLARE_BACKEND_OP)
}  // namespace meta_impl

namespace cuda_impl {
FSDP_BACKEND_OPS(FSDP_DECLARE_BACKEND_OP)
// The device's ceilings, measured on it (profiler/ceilings.h).
double gemm_peak_flops(Device device, DType dtype);
double copy_gbps(Device device);
std::string device_name(Device device);  // "NVIDIA H200"; "" where it cannot be read
std::string attention_path(Device device, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                           int64_t hd, bool causal, int64_t window);  // ops::attention_path
}  // namespace cuda_impl

}  // namespace fsdp::ops
