// The FLOP and byte formulas of every op (cost.h). Bytes are the inputs' sizes plus what the op
// writes; an undefined tensor (no bias, no dw) counts nothing.
#include "src/ops/cost.h"

#include <algorithm>
#include <initializer_list>

namespace fsdp::ops::cost {

namespace {

double bytes_of(std::initializer_list<const Tensor*> ts) {
  double b = 0;
  for (const Tensor* t : ts)
    if (t->defined()) b += double(t->nbytes());
  return b;
}

double n(const Tensor& t) { return double(t.numel()); }
double nbytes(const Tensor& t) { return t.defined() ? double(t.nbytes()) : 0.0; }
// dim 0 of a 2-D weight (a linear's outputs), else 0.
double rows_of_2d(const Tensor& w) { return w.dim() == 2 ? double(w.size(0)) : 0.0; }

// Score FLOPs of attention: 2 matmuls of B H T T hd (halved when causal).
double attention_flops(const Tensor& qkv, int64_t heads, int64_t kv_heads, bool causal) {
  if (qkv.dim() != 3 || heads <= 0) return 0.0;
  const int64_t kv = kv_heads > 0 ? kv_heads : heads;
  const double hd = double(qkv.size(2)) / double(heads + 2 * kv);
  return 4.0 * double(qkv.size(0)) * double(qkv.size(1)) * double(qkv.size(1)) * double(heads) *
         hd * (causal ? 0.5 : 1.0);
}

}  // namespace

Cost gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c) {
  (void)tb;
  const double k = a.dim() == 2 ? double(ta ? a.size(0) : a.size(1)) : 0.0;
  return {2.0 * n(c) * k, bytes_of({&a, &b, &c}) + nbytes(c)};
}

Cost linear_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  const double rows = n(x) / double(std::max<int64_t>(x.dim() ? x.size(-1) : 1, 1));
  return {2.0 * n(x) * rows_of_2d(w),
          bytes_of({&x, &w, &b}) + rows * rows_of_2d(w) * double(dtype_size(x.dtype()))};
}

Cost linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w) {
  return {4.0 * n(x) * rows_of_2d(w), bytes_of({&dy, &x, &w}) + nbytes(x) + nbytes(w)};
}

Cost embedding_forward(const Tensor& ids, const Tensor& w) {
  return {0.0, bytes_of({&ids}) + n(ids) * (w.dim() == 2 ? double(w.size(1)) : 0.0) * 2.0 *
                                      double(dtype_size(w.dtype()))};
}

Cost embedding_backward(const Tensor& dy, const Tensor& ids) {
  return {n(dy), bytes_of({&dy, &ids}) + nbytes(dy)};
}

Cost rmsnorm_forward(const Tensor& x, const Tensor& w) {
  return {4.0 * n(x), bytes_of({&x, &w}) + nbytes(x)};
}

Cost rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w) {
  return {8.0 * n(x), bytes_of({&dy, &x, &w}) + nbytes(x)};
}

Cost silu_forward(const Tensor& x) { return {4.0 * n(x), bytes_of({&x}) + nbytes(x)}; }

Cost silu_backward(const Tensor& dy, const Tensor& x) {
  return {6.0 * n(x), bytes_of({&dy, &x}) + nbytes(x)};
}

Cost swiglu_forward(const Tensor& gate, const Tensor& up) {
  return {5.0 * n(gate), bytes_of({&gate, &up}) + nbytes(gate)};
}

Cost swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up) {
  return {9.0 * n(gate), bytes_of({&dy, &gate, &up}) + 2.0 * nbytes(gate)};
}

// q and k rotate in place (two thirds of a multi-head qkv), v is only read.
Cost rope_(const Tensor& qkv) {
  return {2.0 * n(qkv), bytes_of({&qkv}) + 2.0 / 3.0 * nbytes(qkv)};
}

Cost attention_forward(const Tensor& qkv, int64_t heads, int64_t kv_heads, bool causal) {
  const double out = heads > 0 ? nbytes(qkv) * double(heads) /
                                     double(heads + 2 * (kv_heads > 0 ? kv_heads : heads))
                               : 0.0;
  return {attention_flops(qkv, heads, kv_heads, causal), bytes_of({&qkv}) + out};
}

Cost attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, int64_t heads,
                        int64_t kv_heads, bool causal) {
  return {2.5 * attention_flops(qkv, heads, kv_heads, causal),
          bytes_of({&dout, &qkv, &out}) + nbytes(qkv)};
}

Cost attention_decode(const Tensor& q, const Tensor& k, const Tensor& v) {
  return {q.dim() == 2 && k.dim() >= 1 ? 4.0 * n(q) * double(k.size(0)) : 0.0,
          bytes_of({&q, &k, &v}) + nbytes(q)};
}

Cost add(const Tensor& a, const Tensor& b) { return {n(a), bytes_of({&a, &b}) + nbytes(a)}; }

Cost sum_squares_into(const Tensor& x) { return {2.0 * n(x), bytes_of({&x}) + 8.0}; }

Cost scale_(const Tensor& x) { return {n(x), bytes_of({&x}) + nbytes(x)}; }

Cost cross_entropy_forward(const Tensor& logits, const Tensor& targets) {
  return {3.0 * n(logits), bytes_of({&logits, &targets})};
}

Cost cross_entropy_backward(const Tensor& logits, const Tensor& targets) {
  return {3.0 * n(logits), bytes_of({&logits, &targets}) + nbytes(logits)};
}

Cost copy_segments(const Tensor& dst, const Tensor& src) {
  return {0.0, bytes_of({&src}) + nbytes(dst)};
}

Cost adamw_(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v) {
  return {12.0 * n(param), bytes_of({&param, &grad, &m, &v}) + 3.0 * nbytes(param)};
}

Cost adamw_multi_(const std::vector<AdamWTensors>& ts) {
  Cost c;
  for (const AdamWTensors& a : ts) {
    const Cost one = adamw_(a.param, a.grad, a.exp_avg, a.exp_avg_sq);
    c.flops += one.flops;
    c.bytes += one.bytes;
  }
  return c;
}

Cost moe_combine(const Tensor& rows, const Tensor& pos, const Tensor& weight, const Tensor& base,
                 int64_t k) {
  const double d = rows.dim() == 2 ? double(rows.size(1)) : 0.0, pairs = n(pos);
  const double size = double(dtype_size(rows.dtype()));
  const double out = pairs / double(std::max<int64_t>(k, 1)) * d * size;  // [N, d]
  return {2.0 * pairs * d, pairs * d * size + bytes_of({&pos, &weight, &base}) + out};
}

Cost moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& pos,
                          const Tensor& weight) {
  return {3.0 * n(rows), bytes_of({&dout, &rows, &pos, &weight}) + nbytes(rows) + 8.0 * n(pos)};
}

}  // namespace fsdp::ops::cost
