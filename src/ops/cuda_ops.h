// The CUDA side of fsdp::ops: each function takes tensors already checked
// for shape by ops.cpp, checks device, dtype and layout, allocates outputs on
// the device and launches kernels/cuda on the compute stream. Private; built
// with CUDA only.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "fsdp/ops/ops.h"

namespace fsdp::ops::cuda_impl {

// True when the first defined tensor is on CUDA; then all must be on that device.
bool on_cuda(const char* op, std::initializer_list<const Tensor*> ts);

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,
          double beta);
Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b);
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dw,
                       const Tensor& db);
Tensor embedding_forward(const Tensor& ids, const Tensor& w);
void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dw);
RMSNormOut rmsnorm_forward(const Tensor& x, const Tensor& w, double eps);
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        const Tensor& dw);
Tensor silu_forward(const Tensor& x);
Tensor silu_backward(const Tensor& dy, const Tensor& x);
Tensor swiglu_forward(const Tensor& g, const Tensor& u);
std::pair<Tensor, Tensor> swiglu_backward(const Tensor& dy, const Tensor& g, const Tensor& u);
void rope_(const Tensor& qkv, int64_t heads, double theta, bool inverse);
AttentionOut attention_forward(const Tensor& qkv, int64_t heads, bool causal);
Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int64_t heads, bool causal);
Tensor add(const Tensor& a, const Tensor& b);
void add_(const Tensor& a, const Tensor& b);
void sum_squares_into(const Tensor& x, const Tensor& acc);
void clip_scale_(const Tensor& x, const Tensor& total_sq, double max_norm);
void scale_(const Tensor& x, double s);
CrossEntropyOut cross_entropy_forward(const Tensor& logits, const Tensor& targets, bool read_loss);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              double dloss);
Tensor cross_entropy_backward_(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                               double dloss);
void adamw_(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWHyper& h,
            int64_t step);

}  // namespace fsdp::ops::cuda_impl
