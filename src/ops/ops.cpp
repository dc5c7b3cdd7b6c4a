// Validation and dispatch for every op but attention and rope (attention_ops.cpp). The kernels
// trust what arrives here: contiguous buffers of one compute dtype (f32 or f64) with checked shapes.
#include "fsdp/ops/ops.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>

#include "fsdp/core/trace.h"
#include "fsdp/ops/attention_path.h"
#include "src/ops/backend.h"
#include "src/ops/cost.h"
#include "src/ops/op_checks.h"

namespace fsdp::ops {

using namespace detail;

// ---------------------------------------------------------------- gemm

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,
          double beta) {
  FSDP_OP_SCOPE("gemm", a, ({&a, &b, &c}), cost::gemm(a, ta, b, tb, c));
  FSDP_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "[gemm] needs 2-D tensors, got {} {} {}",
             shape_str(a.shape()), shape_str(b.shape()), shape_str(c.shape()));
  check_same_dtype("gemm", a, b, "A", "B");
  check_same_dtype("gemm", a, c, "A", "C");
  const int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  const int64_t kb = tb ? b.size(1) : b.size(0), n = tb ? b.size(0) : b.size(1);
  FSDP_CHECK(k == kb, "[gemm] inner dims differ: op(A) is [{}, {}], op(B) is [{}, {}]", m, k, kb,
             n);
  FSDP_CHECK(c.size(0) == m && c.size(1) == n, "[gemm] C is {} but op(A) op(B) is [{}, {}]",
             shape_str(c.shape()), m, n);
  FSDP_CHECK(c.is_contiguous(), "[gemm] C must be contiguous");
  if (on_meta({&a, &b, &c})) return meta_impl::gemm(a, ta, b, tb, c, alpha, beta);
  if (on_cuda("gemm", {&a, &b, &c})) return cuda_impl::gemm(a, ta, b, tb, c, alpha, beta);
  return cpu_impl::gemm(a, ta, b, tb, c, alpha, beta);
}

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  FSDP_CHECK(a.dim() == 2 && b.dim() == 2, "[matmul] needs 2-D tensors, got {} and {}",
             shape_str(a.shape()), shape_str(b.shape()));
  Tensor c = Tensor::empty({ta ? a.size(1) : a.size(0), tb ? b.size(0) : b.size(1)}, a.dtype(),
                           a.device());
  gemm(a, ta, b, tb, c, 1.0, 0.0);
  return c;
}

// ---------------------------------------------------------------- linear

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  FSDP_OP_SCOPE("linear", x, ({&x, &w, &b}), cost::linear_forward(x, w, b));
  FSDP_CHECK(w.dim() == 2, "[linear] weight must be 2-D, got {}", shape_str(w.shape()));
  FSDP_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1),
             "[linear] input {} has last dim {} but weight {} expects {}", shape_str(x.shape()),
             x.dim() ? x.size(-1) : 0, shape_str(w.shape()), w.size(1));
  check_same_dtype("linear", x, w, "input", "weight");
  const int64_t out = w.size(0);
  if (b.defined())
    FSDP_CHECK(b.dim() == 1 && b.size(0) == out, "[linear] bias {} does not match {} outputs",
               shape_str(b.shape()), out);
  if (on_meta({&x, &w, &b})) return meta_impl::linear_forward(x, w, b);
  if (on_cuda("linear", {&x, &w, &b})) return cuda_impl::linear_forward(x, w, b);
  return cpu_impl::linear_forward(x, w, b);
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dw,
                       const Tensor& db) {
  FSDP_OP_SCOPE("linear_backward", x, ({&dy, &x, &w}), cost::linear_backward(dy, x, w));
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / std::max<int64_t>(in, 1);
  FSDP_CHECK(dy.numel() == rows * out,
             "[linear_backward] dy {} does not match input {} and weight {}", shape_str(dy.shape()),
             shape_str(x.shape()), shape_str(w.shape()));
  if (dw.defined())
    FSDP_CHECK(dw.shape() == w.shape(), "[linear_backward] dw {} vs weight {}",
               shape_str(dw.shape()), shape_str(w.shape()));
  if (db.defined())
    FSDP_CHECK(db.numel() == out, "[linear_backward] db has {} elements, expected {}", db.numel(),
               out);
  if (on_meta({&dy, &x, &w, &dw, &db})) return meta_impl::linear_backward(dy, x, w, dw, db);
  if (on_cuda("linear_backward", {&dy, &x, &w, &dw, &db}))
    return cuda_impl::linear_backward(dy, x, w, dw, db);
  return cpu_impl::linear_backward(dy, x, w, dw, db);
}

// ---------------------------------------------------------------- embedding

Tensor embedding_forward(const Tensor& ids, const Tensor& w) {
  FSDP_OP_SCOPE("embedding", w, ({&ids}), cost::embedding_forward(ids, w));
  FSDP_CHECK(w.dim() == 2, "[embedding] weight must be [vocab, dim], got {}", shape_str(w.shape()));
  if (on_meta({&w, &ids})) return meta_impl::embedding_forward(ids, w);
  if (on_cuda("embedding", {&w, &ids})) return cuda_impl::embedding_forward(ids, w);
  return cpu_impl::embedding_forward(ids, w);
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dw) {
  FSDP_OP_SCOPE("embedding_backward", dy, ({&dy, &ids}), cost::embedding_backward(dy, ids));
  const int64_t dim = dw.size(1);
  FSDP_CHECK(dy.numel() == ids.numel() * dim,
             "[embedding_backward] dy {} does not match ids {} and dim {}", shape_str(dy.shape()),
             shape_str(ids.shape()), dim);
  if (on_meta({&dw, &dy, &ids})) return meta_impl::embedding_backward(dy, ids, dw);
  if (on_cuda("embedding_backward", {&dw, &dy, &ids}))
    return cuda_impl::embedding_backward(dy, ids, dw);
  return cpu_impl::embedding_backward(dy, ids, dw);
}

// ---------------------------------------------------------------- rmsnorm

double default_rmsnorm_eps(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 2.220446049250313e-16;
    case DType::bf16:
      return 0.0078125;
    case DType::f16:
      return 0.0009765625;
    default:
      return 1.1920928955078125e-07;
  }
}

RMSNormOut rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, double w_offset) {
  FSDP_OP_SCOPE("rmsnorm", x, ({&x, &w}), cost::rmsnorm_forward(x, w));
  FSDP_CHECK(w.dim() == 1 && x.dim() >= 1 && x.size(-1) == w.size(0),
             "[rmsnorm] weight {} does not match the last dim of input {}", shape_str(w.shape()),
             shape_str(x.shape()));
  FSDP_CHECK(eps >= 0, "[rmsnorm] eps must be >= 0, got {}", eps);
  if (on_meta({&x, &w})) return meta_impl::rmsnorm_forward(x, w, eps, w_offset);
  if (on_cuda("rmsnorm", {&x, &w})) return cuda_impl::rmsnorm_forward(x, w, eps, w_offset);
  return cpu_impl::rmsnorm_forward(x, w, eps, w_offset);
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        const Tensor& dw, double w_offset) {
  FSDP_OP_SCOPE("rmsnorm_backward", x, ({&dy, &x, &w}), cost::rmsnorm_backward(dy, x, w));
  FSDP_CHECK(dy.shape() == x.shape(), "[rmsnorm_backward] dy {} vs x {}", shape_str(dy.shape()),
             shape_str(x.shape()));
  const int64_t dim = w.size(0), rows = x.numel() / std::max<int64_t>(dim, 1);
  FSDP_CHECK(rstd.numel() == rows, "[rmsnorm_backward] rstd has {} rows, expected {}", rstd.numel(),
             rows);
  if (on_meta({&dy, &x, &w, &rstd, &dw}))
    return meta_impl::rmsnorm_backward(dy, x, w, rstd, dw, w_offset);
  if (on_cuda("rmsnorm_backward", {&dy, &x, &w, &rstd, &dw}))
    return cuda_impl::rmsnorm_backward(dy, x, w, rstd, dw, w_offset);
  return cpu_impl::rmsnorm_backward(dy, x, w, rstd, dw, w_offset);
}

// ---------------------------------------------------------------- activations

Tensor silu_forward(const Tensor& x) {
  FSDP_OP_SCOPE("silu", x, ({&x}), cost::silu_forward(x));
  if (on_meta({&x})) return meta_impl::silu_forward(x);
  if (on_cuda("silu", {&x})) return cuda_impl::silu_forward(x);
  return cpu_impl::silu_forward(x);
}

Tensor silu_backward(const Tensor& dy, const Tensor& x) {
  FSDP_OP_SCOPE("silu_backward", x, ({&dy, &x}), cost::silu_backward(dy, x));
  FSDP_CHECK(dy.shape() == x.shape(), "[silu_backward] dy {} vs x {}", shape_str(dy.shape()),
             shape_str(x.shape()));
  if (on_meta({&dy, &x})) return meta_impl::silu_backward(dy, x);
  if (on_cuda("silu_backward", {&dy, &x})) return cuda_impl::silu_backward(dy, x);
  return cpu_impl::silu_backward(dy, x);
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up, Gate act) {
  const char* op = act == Gate::silu ? "swiglu" : "geglu";
  FSDP_OP_SCOPE(op, gate, ({&gate, &up}), cost::swiglu_forward(gate, up));
  FSDP_CHECK(gate.shape() == up.shape(), "[{}] gate {} vs up {}", op, shape_str(gate.shape()),
             shape_str(up.shape()));
  if (on_meta({&gate, &up})) return meta_impl::swiglu_forward(gate, up, act);
  if (on_cuda(op, {&gate, &up})) return cuda_impl::swiglu_forward(gate, up, act);
  return cpu_impl::swiglu_forward(gate, up, act);
}

std::pair<Tensor, Tensor> swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up,
                                          Gate act) {
  const char* op = act == Gate::silu ? "swiglu_backward" : "geglu_backward";
  FSDP_OP_SCOPE(op, gate, ({&dy, &gate, &up}), cost::swiglu_backward(dy, gate, up));
  FSDP_CHECK(dy.shape() == gate.shape() && gate.shape() == up.shape(), "[{}] dy {} gate {} up {}",
             op, shape_str(dy.shape()), shape_str(gate.shape()), shape_str(up.shape()));
  if (on_meta({&dy, &gate, &up})) return meta_impl::swiglu_backward(dy, gate, up, act);
  if (on_cuda(op, {&dy, &gate, &up})) return cuda_impl::swiglu_backward(dy, gate, up, act);
  return cpu_impl::swiglu_backward(dy, gate, up, act);
}

// ---------------------------------------------------------------- elementwise

Tensor add(const Tensor& a, const Tensor& b) {
  FSDP_OP_SCOPE("add", a, ({&a, &b}), cost::add(a, b));
  FSDP_CHECK(a.shape() == b.shape(), "[add] shapes differ: {} and {}", shape_str(a.shape()),
             shape_str(b.shape()));
  check_same_dtype("add", a, b, "a", "b");
  FSDP_CHECK(a.device() == b.device(), "[add] a is on {} but b is on {}", a.device().str(),
             b.device().str());
  if (on_meta({&a, &b})) return meta_impl::add(a, b);
  if (on_cuda("add", {&a, &b})) return cuda_impl::add(a, b);
  return cpu_impl::add(a, b);
}

void add_(const Tensor& a, const Tensor& b) {
  FSDP_OP_SCOPE("add_", a, ({&a, &b}), cost::add(a, b));
  FSDP_CHECK(a.shape() == b.shape(), "[add_] shapes differ: {} and {}", shape_str(a.shape()),
             shape_str(b.shape()));
  if (on_meta({&a, &b})) return meta_impl::add_(a, b);
  if (on_cuda("add_", {&a, &b})) return cuda_impl::add_(a, b);
  return cpu_impl::add_(a, b);
}

double sum_squares(const Tensor& x) {
  Tensor acc = Tensor::zeros({1}, DType::f64, x.device());
  sum_squares_into(x, acc);
  return acc.item();
}

void sum_squares_into(const Tensor& x, const Tensor& acc) {
  FSDP_OP_SCOPE("sum_squares", x, ({&x}), cost::sum_squares_into(x));
  FSDP_CHECK(acc.numel() == 1 && acc.dtype() == DType::f64,
             "[sum_squares] the accumulator must be one f64, got {} {}", dtype_name(acc.dtype()),
             shape_str(acc.shape()));
  if (on_meta({&x, &acc})) return meta_impl::sum_squares_into(x, acc);
  if (on_cuda("sum_squares", {&x, &acc})) return cuda_impl::sum_squares_into(x, acc);
  return cpu_impl::sum_squares_into(x, acc);
}

void clip_scale_(const Tensor& x, const Tensor& total_sq, double max_norm) {
  FSDP_OP_SCOPE("clip_scale_", x, ({&x}), cost::scale_(x));
  FSDP_CHECK(total_sq.numel() == 1 && total_sq.dtype() == DType::f64,
             "[clip_grad_norm] the squared norm must be one f64, got {} {}",
             dtype_name(total_sq.dtype()), shape_str(total_sq.shape()));
  if (on_meta({&x, &total_sq})) return meta_impl::clip_scale_(x, total_sq, max_norm);
  if (on_cuda("clip_grad_norm", {&x, &total_sq}))
    return cuda_impl::clip_scale_(x, total_sq, max_norm);
  return cpu_impl::clip_scale_(x, total_sq, max_norm);
}

void scale_(const Tensor& x, double s) {
  FSDP_OP_SCOPE("scale_", x, ({&x}), cost::scale_(x));
  if (on_meta({&x})) return meta_impl::scale_(x, s);
  if (on_cuda("scale_", {&x})) return cuda_impl::scale_(x, s);
  return cpu_impl::scale_(x, s);
}

// ---------------------------------------------------------------- loss

namespace {

// The divisor of the summed loss: the caller's, or the rows (the mean) when it gave 0.
double xent_divisor(const char* op, double divisor, int64_t rows) {
  FSDP_CHECK(std::isfinite(divisor) && divisor >= 0,
             "[{}] divisor must be finite and not negative (0: the rows), got {}", op, divisor);
  return divisor == 0 ? double(rows) : divisor;
}

}  // namespace

CrossEntropyOut cross_entropy_forward(const Tensor& logits, const Tensor& targets, bool read_loss,
                                      double divisor) {
  FSDP_OP_SCOPE("cross_entropy", logits, ({&logits, &targets}),
                cost::cross_entropy_forward(logits, targets));
  FSDP_CHECK(logits.dim() == 2, "[cross_entropy] logits must be [N, V], got {}",
             shape_str(logits.shape()));
  const int64_t n = logits.size(0);
  FSDP_CHECK(targets.numel() == n, "[cross_entropy] {} targets for {} rows of logits",
             targets.numel(), n);
  FSDP_CHECK(n > 0, "[cross_entropy] no rows");
  divisor = xent_divisor("cross_entropy", divisor, n);
  if (on_meta({&logits, &targets}))
    return meta_impl::cross_entropy_forward(logits, targets, read_loss, divisor);
  if (on_cuda("cross_entropy", {&logits, &targets}))
    return cuda_impl::cross_entropy_forward(logits, targets, read_loss, divisor);
  return cpu_impl::cross_entropy_forward(logits, targets, read_loss, divisor);
}

namespace {

void check_xent_backward(const char* op, const Tensor& logits, const Tensor& targets,
                         const Tensor& lse) {
  FSDP_CHECK(logits.dim() == 2, "[{}] logits must be [N, V], got {}", op,
             shape_str(logits.shape()));
  FSDP_CHECK(lse.numel() == logits.size(0) && targets.numel() == logits.size(0),
             "[{}] lse {} / targets {} for {} rows", op, lse.numel(), targets.numel(),
             logits.size(0));
}

}  // namespace

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              double dloss, double divisor) {
  FSDP_OP_SCOPE("cross_entropy_backward", logits, ({&logits, &targets}),
                cost::cross_entropy_backward(logits, targets));
  check_xent_backward("cross_entropy_backward", logits, targets, lse);
  divisor = xent_divisor("cross_entropy_backward", divisor, logits.size(0));
  if (on_meta({&logits, &targets, &lse}))
    return meta_impl::cross_entropy_backward(logits, targets, lse, dloss, divisor);
  if (on_cuda("cross_entropy_backward", {&logits, &targets, &lse}))
    return cuda_impl::cross_entropy_backward(logits, targets, lse, dloss, divisor);
  return cpu_impl::cross_entropy_backward(logits, targets, lse, dloss, divisor);
}

Tensor cross_entropy_backward_(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                               double dloss, double divisor) {
  FSDP_OP_SCOPE("cross_entropy_backward_", logits, ({&logits, &targets}),
                cost::cross_entropy_backward(logits, targets));
  check_xent_backward("cross_entropy_backward_", logits, targets, lse);
  FSDP_CHECK(logits.is_contiguous(), "[cross_entropy_backward_] logits {} must be contiguous",
             shape_str(logits.shape()));
  divisor = xent_divisor("cross_entropy_backward_", divisor, logits.size(0));
  if (on_meta({&logits, &targets, &lse}))
    return meta_impl::cross_entropy_backward_(logits, targets, lse, dloss, divisor);
  if (on_cuda("cross_entropy_backward_", {&logits, &targets, &lse}))
    return cuda_impl::cross_entropy_backward_(logits, targets, lse, dloss, divisor);
  return cpu_impl::cross_entropy_backward_(logits, targets, lse, dloss, divisor);
}

// ---------------------------------------------------------------- copies

void copy_segments(const Tensor& dst, const Tensor& src, const std::vector<Segment>& segments) {
  FSDP_OP_SCOPE("copy_segments", dst, ({&src}), cost::copy_segments(dst, src));
  FSDP_CHECK(dst.dim() == 1 && src.dim() == 1 && dst.is_contiguous() && src.is_contiguous(),
             "[copy_segments] needs flat contiguous buffers, got {} and {}", shape_str(dst.shape()),
             shape_str(src.shape()));
  FSDP_CHECK(dst.device() == src.device(), "[copy_segments] dst on {} but src on {}",
             dst.device().str(), src.device().str());
  for (const Segment& g : segments)
    FSDP_CHECK(g.count >= 0 && g.dst_offset >= 0 && g.src_offset >= 0 &&
                   g.dst_offset + g.count <= dst.numel() && g.src_offset + g.count <= src.numel(),
               "[copy_segments] segment ({}, {}, {}) is outside dst of {} or src of {}",
               g.dst_offset, g.src_offset, g.count, dst.numel(), src.numel());
  if (on_meta({&dst, &src})) return meta_impl::copy_segments(dst, src, segments);
  if (on_cuda("copy_segments", {&dst, &src})) return cuda_impl::copy_segments(dst, src, segments);
  return cpu_impl::copy_segments(dst, src, segments);
}

// ---------------------------------------------------------------- optimizer

void adamw_(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
            const AdamWHyper& h, int64_t step) {
  adamw_multi_({{param, grad, m, v, h.weight_decay}}, h, step);
}

void adamw_multi_(const std::vector<AdamWTensors>& ts, const AdamWHyper& h, int64_t step,
                  const GradClip& clip) {
  if (ts.empty()) return;
  const Tensor& first = ts.front().param;
  FSDP_OP_SCOPE("adamw", first, ({&first}), cost::adamw_multi_(ts));
  for (const AdamWTensors& a : ts)
    for (const Tensor* t : {&a.param, &a.grad, &a.exp_avg, &a.exp_avg_sq}) {
      FSDP_CHECK(t->is_contiguous() && t->numel() == a.param.numel() &&
                     t->dtype() == first.dtype() && t->device() == first.device(),
                 "[adamw] param, grad, exp_avg and exp_avg_sq must be contiguous {} buffers on {} "
                 "of {} elements; got {} {} elements on {}",
                 dtype_name(first.dtype()), first.device().str(), a.param.numel(),
                 dtype_name(t->dtype()), t->numel(), t->device().str());
    }
  FSDP_CHECK(step >= 1, "[adamw] step must be >= 1, got {}", step);
  FSDP_CHECK(h.lr >= 0 && h.eps >= 0 && h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
             "[adamw] bad hyper-parameters lr {} betas ({}, {}) eps {}", h.lr, h.beta1, h.beta2,
             h.eps);
  const bool clipped = clip.total_sq.defined() && clip.max_norm > 0;
  if (clipped)
    FSDP_CHECK(clip.total_sq.numel() == 1 && clip.total_sq.dtype() == DType::f64 &&
                   clip.total_sq.device() == first.device(),
               "[adamw] the clipping's squared norm must be one f64 on {}, got {} {} on {}",
               first.device().str(), clip.total_sq.numel(), dtype_name(clip.total_sq.dtype()),
               clip.total_sq.device().str());
  const GradClip c = clipped ? clip : GradClip{};
  if (on_meta({&first})) return meta_impl::adamw_multi_(ts, h, step, c);
  if (on_cuda("adamw", {&first})) return cuda_impl::adamw_multi_(ts, h, step, c);
  return cpu_impl::adamw_multi_(ts, h, step, c);
}

std::string attention_path(Device device, DType dtype, int64_t B, int64_t T, int64_t heads,
                           int64_t kv_heads, int64_t head_dim, bool causal, int64_t window) {
  FSDP_CHECK(window == 0 || (window > 0 && causal),
             "[attention_path] a sliding window ({}) is causal and positive", window);
  if (device.is_cpu()) return "our kernel (CPU)";
  return cuda_impl::attention_path(device, dtype, B, T, heads, kv_heads, head_dim, causal, window);
}

}  // namespace fsdp::ops
