// What each op of src/ops/backend.h must do: the FLOPs it computes and the bytes it must move
// (every input read once, every output written once), from its arguments' shapes and dtypes.
// These are the one definition of each formula: ops.cpp records them in the profiler's op
// records (the roofline verdicts divide by them), and the op-case table of the tests and the
// kernel benchmark (tests/op_cases.h) sets each case's floor by them. A formula takes the op's
// own arguments and is total: it never throws on shapes the op would refuse (the profiler
// records before the op checks), it returns 0 where it cannot tell.
// Private to the library.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/ops/ops.h"

namespace fsdp::ops::cost {

struct Cost {
  double flops = 0, bytes = 0;
};

Cost gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c);
Cost linear_forward(const Tensor& x, const Tensor& w, const Tensor& b);
Cost linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w);
Cost embedding_forward(const Tensor& ids, const Tensor& w);
Cost embedding_backward(const Tensor& dy, const Tensor& ids);
Cost rmsnorm_forward(const Tensor& x, const Tensor& w);
Cost rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w);
Cost silu_forward(const Tensor& x);
Cost silu_backward(const Tensor& dy, const Tensor& x);
Cost swiglu_forward(const Tensor& gate, const Tensor& up);
Cost swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up);
Cost rope_(const Tensor& qkv);  // forward and inverse alike
// kv_heads 0 is heads, as in the ops.
Cost attention_forward(const Tensor& qkv, int64_t heads, int64_t kv_heads, bool causal);
Cost attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, int64_t heads,
                        int64_t kv_heads, bool causal);
Cost attention_decode(const Tensor& q, const Tensor& k, const Tensor& v);
Cost add(const Tensor& a, const Tensor& b);  // add and add_
Cost sum_squares_into(const Tensor& x);
Cost scale_(const Tensor& x);  // scale_ and clip_scale_
Cost cross_entropy_forward(const Tensor& logits, const Tensor& targets);
// cross_entropy_backward and cross_entropy_backward_ (the same traffic, written in place).
Cost cross_entropy_backward(const Tensor& logits, const Tensor& targets);
Cost copy_segments(const Tensor& dst, const Tensor& src);
Cost adamw_(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v);
Cost adamw_multi_(const std::vector<AdamWTensors>& ts);
// The MoE combine: every (token, choice) row read once (2 FLOPs an element); its backward reads
// dout and the rows and writes drows (3 FLOPs an element: the product and the dot).
Cost moe_combine(const Tensor& rows, const Tensor& pos, const Tensor& weight, const Tensor& base,
                 int64_t k);
Cost moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& pos,
                          const Tensor& weight);

}  // namespace fsdp::ops::cost
