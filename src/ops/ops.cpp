// Validation and dispatch for every op. The kernels trust what arrives here:
// contiguous buffers of one compute dtype (f32 or f64) with checked shapes.
#include "fsdp/ops/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <string_view>

#include "fsdp/core/trace.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dispatch.h"
#ifdef FSDP_WITH_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "src/ops/cuda_ops.h"
// After an op's shape checks: CUDA tensors go to the CUDA implementation.
// FSDP_CUDA_DISPATCH(("op", {&inputs...}), call(args...));
#define FSDP_CUDA_DISPATCH(check, ...) \
  if (cuda_impl::on_cuda check) return cuda_impl::__VA_ARGS__
#else
#define FSDP_CUDA_DISPATCH(check, ...)
#endif

namespace fsdp::ops {

namespace cpu = kernels::cpu;

namespace {

// Without CUDA, a CUDA tensor is refused up front; with CUDA, each op hands
// CUDA tensors to cuda_impl after its shape checks.
void require_cpu([[maybe_unused]] const char* op,
                 [[maybe_unused]] std::initializer_list<const Tensor*> ts) {
#ifndef FSDP_WITH_CUDA
  for (const Tensor* t : ts)
    if (t->defined() && !t->device().is_cpu())
      FSDP_FAIL("[{}] built without CUDA (input on {})", op, t->device().str());
#endif
}

// bf16 and f16 compute in f32; f32 and f64 compute as themselves.
DType compute_dtype(DType t) {
  FSDP_CHECK(is_floating(t), "[ops] expected a floating dtype, got {}", dtype_name(t));
  return t == DType::f64 ? DType::f64 : DType::f32;
}

Tensor as_compute(const Tensor& t, DType ct) { return t.to(ct).contiguous(); }

// Narrows a compute-dtype result back to the storage dtype of the inputs.
Tensor as_storage(const Tensor& t, DType storage) { return t.to(storage); }

// A gradient buffer to add into. When it is not already a contiguous buffer
// of the compute dtype, the kernel adds into a widened copy and finish()
// writes it back.
class Accum {
 public:
  Accum(const Tensor& target, DType ct) : target_(target) {
    if (target.defined()) work_ = as_compute(target, ct);
  }
  template <class T>
  T* data() const {
    return work_.defined() ? work_.data<T>() : nullptr;
  }
  void finish() {
    if (work_.defined() && !work_.shares_storage_with(target_)) target_.copy_(work_);
  }

 private:
  Tensor target_, work_;
};

std::string shapes_of(std::initializer_list<const Tensor*> ts) {
  std::string s;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!s.empty()) s += ", ";
    s += shape_str(t->shape());
  }
  return s;
}

double bytes_of(std::initializer_list<const Tensor*> ts) {
  double b = 0;
  for (const Tensor* t : ts)
    if (t->defined()) b += double(t->nbytes());
  return b;
}

// Records the op when the profiler is on: shapes, dtype, FLOPs, and the
// bytes it must move (inputs plus outputs, `out_bytes` of them written).
#define FSDP_OP_SCOPE(name, first, inputs, flops, out_bytes)                                 \
  trace::Scope prof_scope_(name);                                                            \
  if (prof_scope_.on())                                                                      \
  prof_scope_.set(shapes_of inputs, std::string(dtype_name((first).dtype())), double(flops), \
                  bytes_of inputs + double(out_bytes), (first).device().str())

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b, const char* an,
                      const char* bn) {
  FSDP_CHECK(a.dtype() == b.dtype(), "[{}] {} is {} but {} is {}", op, an, dtype_name(a.dtype()),
             bn, dtype_name(b.dtype()));
}

template <class I>
void check_ids(const char* op, const Tensor& ids, int64_t vocab, const char* what) {
  const I* p = ids.data<I>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    FSDP_CHECK(p[i] >= 0 && p[i] < vocab, "[{}] {} {} at position {} is outside [0, {})", op, what,
               int64_t(p[i]), i, vocab);
}

}  // namespace

// ---------------------------------------------------------------- gemm

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,
          double beta) {
  FSDP_OP_SCOPE("gemm", a, ({&a, &b, &c}),
                2.0 * double(c.numel()) * double(ta ? a.size(0) : a.size(-1)), c.nbytes());
  require_cpu("gemm", {&a, &b, &c});
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
  FSDP_CUDA_DISPATCH(("gemm", {&a, &b, &c}), gemm(a, ta, b, tb, c, alpha, beta));
  const DType ct = compute_dtype(a.dtype());
  Tensor A = as_compute(a, ct), B = as_compute(b, ct);
  Accum C(c, ct);
  cpu::dispatch_compute(ct, "gemm", [&](auto tv) {
    using T = decltype(tv);
    cpu::gemm<T>(ta, tb, m, n, k, T(alpha), A.data<T>(), a.size(1), B.data<T>(), b.size(1), T(beta),
                 C.data<T>(), n);
  });
  C.finish();
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
  FSDP_OP_SCOPE("linear", x, ({&x, &w, &b}),
                2.0 * double(x.numel()) * double(w.dim() == 2 ? w.size(0) : 0),
                double(x.numel()) / std::max<int64_t>(x.dim() ? x.size(-1) : 1, 1) *
                    double(w.dim() == 2 ? w.size(0) : 0) * double(dtype_size(x.dtype())));
  require_cpu("linear", {&x, &w, &b});
  FSDP_CHECK(w.dim() == 2, "[linear] weight must be 2-D, got {}", shape_str(w.shape()));
  FSDP_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1),
             "[linear] input {} has last dim {} but weight {} expects {}", shape_str(x.shape()),
             x.dim() ? x.size(-1) : 0, shape_str(w.shape()), w.size(1));
  check_same_dtype("linear", x, w, "input", "weight");
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / std::max<int64_t>(in, 1);
  if (b.defined())
    FSDP_CHECK(b.dim() == 1 && b.size(0) == out, "[linear] bias {} does not match {} outputs",
               shape_str(b.shape()), out);
  FSDP_CUDA_DISPATCH(("linear", {&x, &w, &b}), linear_forward(x, w, b));
  const DType ct = compute_dtype(x.dtype());
  Tensor X = as_compute(x, ct), W = as_compute(w, ct);
  Shape ys = x.shape();
  ys.back() = out;
  Tensor y = Tensor::empty(ys, ct);
  cpu::dispatch_compute(ct, "linear", [&](auto tv) {
    using T = decltype(tv);
    cpu::gemm<T>(false, true, rows, out, in, T(1), X.data<T>(), in, W.data<T>(), in, T(0),
                 y.data<T>(), out);
    if (b.defined()) cpu::bias_add_rows<T>(y.data<T>(), as_compute(b, ct).data<T>(), rows, out);
  });
  return as_storage(y, x.dtype());
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dw,
                       const Tensor& db) {
  FSDP_OP_SCOPE("linear_backward", x, ({&dy, &x, &w}), 4.0 * double(x.numel()) * double(w.size(0)),
                x.nbytes() + w.nbytes());
  require_cpu("linear_backward", {&dy, &x, &w, &dw, &db});
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
  FSDP_CUDA_DISPATCH(("linear_backward", {&dy, &x, &w, &dw, &db}),
                     linear_backward(dy, x, w, dw, db));
  const DType ct = compute_dtype(x.dtype());
  Tensor DY = as_compute(dy, ct), X = as_compute(x, ct), W = as_compute(w, ct);
  Tensor dx = Tensor::empty(x.shape(), ct);
  Accum DW(dw, ct), DB(db, ct);
  cpu::dispatch_compute(ct, "linear_backward", [&](auto tv) {
    using T = decltype(tv);
    cpu::gemm<T>(false, false, rows, in, out, T(1), DY.data<T>(), out, W.data<T>(), in, T(0),
                 dx.data<T>(), in);
    if (dw.defined())
      cpu::gemm<T>(true, false, out, in, rows, T(1), DY.data<T>(), out, X.data<T>(), in, T(1),
                   DW.data<T>(), in);
    if (db.defined()) cpu::sum_rows_into<T>(DY.data<T>(), DB.data<T>(), rows, out);
  });
  DW.finish();
  DB.finish();
  return as_storage(dx, x.dtype());
}

// ---------------------------------------------------------------- embedding

Tensor embedding_forward(const Tensor& ids, const Tensor& w) {
  FSDP_OP_SCOPE("embedding", w, ({&ids}), 0,
                double(ids.numel()) * double(w.dim() == 2 ? w.size(1) : 0) * 2 *
                    double(dtype_size(w.dtype())));
  require_cpu("embedding", {&ids, &w});
  FSDP_CHECK(w.dim() == 2, "[embedding] weight must be [vocab, dim], got {}", shape_str(w.shape()));
  const int64_t vocab = w.size(0), dim = w.size(1);
  Tensor I = ids.contiguous();
  FSDP_CUDA_DISPATCH(("embedding", {&w, &ids}), embedding_forward(ids, w));
  const DType ct = compute_dtype(w.dtype());
  Tensor W = as_compute(w, ct);
  Shape ys = ids.shape();
  ys.push_back(dim);
  Tensor y = Tensor::empty(ys, ct);
  cpu::dispatch_index(I.dtype(), "embedding", [&](auto iv) {
    using Ix = decltype(iv);
    check_ids<Ix>("embedding", I, vocab, "token id");
    cpu::dispatch_compute(ct, "embedding", [&](auto tv) {
      using T = decltype(tv);
      cpu::embedding_forward<T, Ix>(I.data<Ix>(), W.data<T>(), y.data<T>(), I.numel(), dim);
    });
  });
  return as_storage(y, w.dtype());
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dw) {
  FSDP_OP_SCOPE("embedding_backward", dy, ({&dy, &ids}), double(dy.numel()), dy.nbytes());
  require_cpu("embedding_backward", {&dy, &ids, &dw});
  const int64_t dim = dw.size(1);
  FSDP_CHECK(dy.numel() == ids.numel() * dim,
             "[embedding_backward] dy {} does not match ids {} and dim {}", shape_str(dy.shape()),
             shape_str(ids.shape()), dim);
  Tensor I = ids.contiguous();
  FSDP_CUDA_DISPATCH(("embedding_backward", {&dw, &dy, &ids}), embedding_backward(dy, ids, dw));
  const DType ct = compute_dtype(dw.dtype());
  Tensor DY = as_compute(dy, ct);
  Accum DW(dw, ct);
  cpu::dispatch_index(I.dtype(), "embedding_backward", [&](auto iv) {
    using Ix = decltype(iv);
    check_ids<Ix>("embedding_backward", I, dw.size(0), "token id");
    cpu::dispatch_compute(ct, "embedding_backward", [&](auto tv) {
      using T = decltype(tv);
      cpu::embedding_backward<T, Ix>(I.data<Ix>(), DY.data<T>(), DW.data<T>(), I.numel(), dim);
    });
  });
  DW.finish();
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

RMSNormOut rmsnorm_forward(const Tensor& x, const Tensor& w, double eps) {
  FSDP_OP_SCOPE("rmsnorm", x, ({&x, &w}), 4.0 * double(x.numel()), x.nbytes());
  require_cpu("rmsnorm", {&x, &w});
  FSDP_CHECK(w.dim() == 1 && x.dim() >= 1 && x.size(-1) == w.size(0),
             "[rmsnorm] weight {} does not match the last dim of input {}", shape_str(w.shape()),
             shape_str(x.shape()));
  FSDP_CHECK(eps >= 0, "[rmsnorm] eps must be >= 0, got {}", eps);
  const int64_t dim = w.size(0), rows = x.numel() / std::max<int64_t>(dim, 1);
  FSDP_CUDA_DISPATCH(("rmsnorm", {&x, &w}), rmsnorm_forward(x, w, eps));
  const DType ct = compute_dtype(x.dtype());
  Tensor X = as_compute(x, ct), W = as_compute(w, ct);
  Tensor y = Tensor::empty(x.shape(), ct), rstd = Tensor::empty({rows}, ct);
  cpu::dispatch_compute(ct, "rmsnorm", [&](auto tv) {
    using T = decltype(tv);
    cpu::rmsnorm_forward<T>(X.data<T>(), W.data<T>(), y.data<T>(), rstd.data<T>(), rows, dim, eps);
  });
  return {as_storage(y, x.dtype()), rstd};
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        const Tensor& dw) {
  FSDP_OP_SCOPE("rmsnorm_backward", x, ({&dy, &x, &w}), 8.0 * double(x.numel()), x.nbytes());
  require_cpu("rmsnorm_backward", {&dy, &x, &w, &rstd, &dw});
  FSDP_CHECK(dy.shape() == x.shape(), "[rmsnorm_backward] dy {} vs x {}", shape_str(dy.shape()),
             shape_str(x.shape()));
  const int64_t dim = w.size(0), rows = x.numel() / std::max<int64_t>(dim, 1);
  FSDP_CHECK(rstd.numel() == rows, "[rmsnorm_backward] rstd has {} rows, expected {}", rstd.numel(),
             rows);
  FSDP_CUDA_DISPATCH(("rmsnorm_backward", {&dy, &x, &w, &rstd, &dw}),
                     rmsnorm_backward(dy, x, w, rstd, dw));
  const DType ct = compute_dtype(x.dtype());
  Tensor DY = as_compute(dy, ct), X = as_compute(x, ct), W = as_compute(w, ct),
         R = as_compute(rstd, ct);
  Tensor dx = Tensor::empty(x.shape(), ct);
  Accum DW(dw, ct);
  cpu::dispatch_compute(ct, "rmsnorm_backward", [&](auto tv) {
    using T = decltype(tv);
    Tensor scratch;
    T* dwp = DW.data<T>();
    if (!dwp) {  // no weight gradient wanted: reduce into a scratch buffer
      scratch = Tensor::zeros({dim}, ct);
      dwp = scratch.data<T>();
    }
    cpu::rmsnorm_backward<T>(DY.data<T>(), X.data<T>(), W.data<T>(), R.data<T>(), dx.data<T>(), dwp,
                             rows, dim);
  });
  DW.finish();
  return as_storage(dx, x.dtype());
}

// ---------------------------------------------------------------- activations

Tensor silu_forward(const Tensor& x) {
  FSDP_OP_SCOPE("silu", x, ({&x}), 4.0 * double(x.numel()), x.nbytes());
  require_cpu("silu", {&x});
  FSDP_CUDA_DISPATCH(("silu", {&x}), silu_forward(x));
  const DType ct = compute_dtype(x.dtype());
  Tensor X = as_compute(x, ct), y = Tensor::empty(x.shape(), ct);
  cpu::dispatch_compute(ct, "silu", [&](auto tv) {
    using T = decltype(tv);
    cpu::silu_forward<T>(X.data<T>(), y.data<T>(), x.numel());
  });
  return as_storage(y, x.dtype());
}

Tensor silu_backward(const Tensor& dy, const Tensor& x) {
  FSDP_OP_SCOPE("silu_backward", x, ({&dy, &x}), 6.0 * double(x.numel()), x.nbytes());
  require_cpu("silu_backward", {&dy, &x});
  FSDP_CHECK(dy.shape() == x.shape(), "[silu_backward] dy {} vs x {}", shape_str(dy.shape()),
             shape_str(x.shape()));
  FSDP_CUDA_DISPATCH(("silu_backward", {&dy, &x}), silu_backward(dy, x));
  const DType ct = compute_dtype(x.dtype());
  Tensor DY = as_compute(dy, ct), X = as_compute(x, ct), dx = Tensor::empty(x.shape(), ct);
  cpu::dispatch_compute(ct, "silu_backward", [&](auto tv) {
    using T = decltype(tv);
    cpu::silu_backward<T>(DY.data<T>(), X.data<T>(), dx.data<T>(), x.numel());
  });
  return as_storage(dx, x.dtype());
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up) {
  FSDP_OP_SCOPE("swiglu", gate, ({&gate, &up}), 5.0 * double(gate.numel()), gate.nbytes());
  require_cpu("swiglu", {&gate, &up});
  FSDP_CHECK(gate.shape() == up.shape(), "[swiglu] gate {} vs up {}", shape_str(gate.shape()),
             shape_str(up.shape()));
  FSDP_CUDA_DISPATCH(("swiglu", {&gate, &up}), swiglu_forward(gate, up));
  const DType ct = compute_dtype(gate.dtype());
  Tensor G = as_compute(gate, ct), U = as_compute(up, ct), y = Tensor::empty(gate.shape(), ct);
  cpu::dispatch_compute(ct, "swiglu", [&](auto tv) {
    using T = decltype(tv);
    cpu::swiglu_forward<T>(G.data<T>(), U.data<T>(), y.data<T>(), y.numel());
  });
  return as_storage(y, gate.dtype());
}

std::pair<Tensor, Tensor> swiglu_backward(const Tensor& dy, const Tensor& gate, const Tensor& up) {
  FSDP_OP_SCOPE("swiglu_backward", gate, ({&dy, &gate, &up}), 9.0 * double(gate.numel()),
                2.0 * double(gate.nbytes()));
  require_cpu("swiglu_backward", {&dy, &gate, &up});
  FSDP_CHECK(dy.shape() == gate.shape() && gate.shape() == up.shape(),
             "[swiglu_backward] dy {} gate {} up {}", shape_str(dy.shape()),
             shape_str(gate.shape()), shape_str(up.shape()));
  FSDP_CUDA_DISPATCH(("swiglu_backward", {&dy, &gate, &up}), swiglu_backward(dy, gate, up));
  const DType ct = compute_dtype(gate.dtype());
  Tensor DY = as_compute(dy, ct), G = as_compute(gate, ct), U = as_compute(up, ct);
  Tensor dg = Tensor::empty(gate.shape(), ct), du = Tensor::empty(gate.shape(), ct);
  cpu::dispatch_compute(ct, "swiglu_backward", [&](auto tv) {
    using T = decltype(tv);
    cpu::swiglu_backward<T>(DY.data<T>(), G.data<T>(), U.data<T>(), dg.data<T>(), du.data<T>(),
                            dg.numel());
  });
  return {as_storage(dg, gate.dtype()), as_storage(du, gate.dtype())};
}

// ---------------------------------------------------------------- attention

namespace {
struct QkvDims {
  int64_t B, T, H, hd;
};
QkvDims qkv_dims(const char* op, const Tensor& qkv, int64_t heads) {
  FSDP_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "[{}] qkv must be [B, T, 3*dim], got {}", op,
             shape_str(qkv.shape()));
  const int64_t d = qkv.size(2) / 3;
  FSDP_CHECK(heads > 0 && d % heads == 0, "[{}] dim {} is not divisible by heads {}", op, d, heads);
  return {qkv.size(0), qkv.size(1), heads, d / heads};
}
}  // namespace

void rope_(const Tensor& qkv, int64_t heads, double theta, bool inverse) {
  FSDP_OP_SCOPE(inverse ? "rope_backward" : "rope", qkv, ({&qkv}), 2.0 * double(qkv.numel()),
                2.0 / 3.0 * double(qkv.nbytes()));
  require_cpu("rope", {&qkv});
  const QkvDims dims = qkv_dims("rope", qkv, heads);
  const int64_t B = dims.B, T_ = dims.T, H = dims.H, hd = dims.hd;  // (lambdas capture these)
  FSDP_CHECK(hd % 2 == 0, "[rope] head dim {} must be even", hd);
  FSDP_CUDA_DISPATCH(("rope", {&qkv}), rope_(qkv, heads, theta, inverse));
  const DType ct = compute_dtype(qkv.dtype());
  Accum Q(qkv, ct);  // in place; bf16/f16 round-trip through f32
  cpu::dispatch_compute(ct, "rope", [&](auto tv) {
    using T = decltype(tv);
    cpu::rope_qkv<T>(Q.data<T>(), B, T_, H, hd, theta, inverse);
  });
  Q.finish();
}

AttentionOut attention_forward(const Tensor& qkv, int64_t heads, bool causal) {
  FSDP_OP_SCOPE("attention", qkv, ({&qkv}),
                qkv.dim() == 3
                    ? 4.0 * double(qkv.size(0)) * double(qkv.size(1)) * double(qkv.size(1)) *
                          double(qkv.size(2) / 3) * (causal ? 0.5 : 1.0)
                    : 0.0,
                double(qkv.nbytes()) / 3.0);
  require_cpu("attention", {&qkv});
  const QkvDims dims = qkv_dims("attention", qkv, heads);
  const int64_t B = dims.B, T_ = dims.T, H = dims.H, hd = dims.hd;  // (lambdas capture these)
  FSDP_CUDA_DISPATCH(("attention", {&qkv}), attention_forward(qkv, heads, causal));
  const DType ct = compute_dtype(qkv.dtype());
  Tensor Q = as_compute(qkv, ct);
  Tensor out = Tensor::empty({B, T_, H * hd}, ct), lse = Tensor::empty({B, H, T_}, ct);
  cpu::dispatch_compute(ct, "attention", [&](auto tv) {
    using T = decltype(tv);
    cpu::attention_forward<T>(Q.data<T>(), out.data<T>(), lse.data<T>(), B, T_, H, hd, causal);
  });
  return {as_storage(out, qkv.dtype()), lse};
}

Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int64_t heads, bool causal) {
  FSDP_OP_SCOPE("attention_backward", qkv, ({&dout, &qkv, &out}),
                qkv.dim() == 3
                    ? 10.0 * double(qkv.size(0)) * double(qkv.size(1)) * double(qkv.size(1)) *
                          double(qkv.size(2) / 3) * (causal ? 0.5 : 1.0)
                    : 0.0,
                qkv.nbytes());
  require_cpu("attention_backward", {&dout, &qkv, &out, &lse});
  const QkvDims dims = qkv_dims("attention_backward", qkv, heads);
  const int64_t B = dims.B, T_ = dims.T, H = dims.H, hd = dims.hd;  // (lambdas capture these)
  FSDP_CHECK(dout.shape() == Shape({B, T_, H * hd}) && out.shape() == dout.shape(),
             "[attention_backward] dout {} / out {} do not match qkv {}", shape_str(dout.shape()),
             shape_str(out.shape()), shape_str(qkv.shape()));
  FSDP_CHECK(lse.numel() == B * H * T_, "[attention_backward] lse has {} elements, expected {}",
             lse.numel(), B * H * T_);
  FSDP_CUDA_DISPATCH(("attention_backward", {&dout, &qkv, &out, &lse}),
                     attention_backward(dout, qkv, out, lse, heads, causal));
  const DType ct = compute_dtype(qkv.dtype());
  Tensor DO = as_compute(dout, ct), Q = as_compute(qkv, ct), O = as_compute(out, ct),
         L = as_compute(lse, ct);
  Tensor dqkv = Tensor::empty(qkv.shape(), ct);
  cpu::dispatch_compute(ct, "attention_backward", [&](auto tv) {
    using T = decltype(tv);
    cpu::attention_backward<T>(DO.data<T>(), Q.data<T>(), O.data<T>(), L.data<T>(), dqkv.data<T>(),
                               B, T_, H, hd, causal);
  });
  return as_storage(dqkv, qkv.dtype());
}

// ---------------------------------------------------------------- elementwise

Tensor add(const Tensor& a, const Tensor& b) {
  FSDP_OP_SCOPE("add", a, ({&a, &b}), double(a.numel()), a.nbytes());
  FSDP_CHECK(a.shape() == b.shape(), "[add] shapes differ: {} and {}", shape_str(a.shape()),
             shape_str(b.shape()));
  check_same_dtype("add", a, b, "a", "b");
  FSDP_CHECK(a.device() == b.device(), "[add] a is on {} but b is on {}", a.device().str(),
             b.device().str());
  FSDP_CUDA_DISPATCH(("add", {&a, &b}), add(a, b));
  require_cpu("add", {&a, &b});
  const DType ct = compute_dtype(a.dtype());
  Tensor A = as_compute(a, ct), B = as_compute(b, ct), out = Tensor::empty(a.shape(), ct);
  cpu::dispatch_compute(ct, "add", [&](auto tv) {
    using T = decltype(tv);
    cpu::add<T>(A.data<T>(), B.data<T>(), out.data<T>(), a.numel());
  });
  return as_storage(out, a.dtype());
}

void add_(const Tensor& a, const Tensor& b) {
  FSDP_OP_SCOPE("add_", a, ({&a, &b}), double(a.numel()), a.nbytes());
  require_cpu("add_", {&a, &b});
  FSDP_CHECK(a.shape() == b.shape(), "[add_] shapes differ: {} and {}", shape_str(a.shape()),
             shape_str(b.shape()));
  FSDP_CUDA_DISPATCH(("add_", {&a, &b}), add_(a, b));
  const DType ct = compute_dtype(a.dtype());
  Accum A(a, ct);
  Tensor B = as_compute(b, ct);
  cpu::dispatch_compute(ct, "add_", [&](auto tv) {
    using T = decltype(tv);
    cpu::add_inplace<T>(A.data<T>(), B.data<T>(), a.numel());
  });
  A.finish();
}

double sum_squares(const Tensor& x) {
  require_cpu("sum_squares", {&x});
  if (x.device().is_cuda()) {
    Tensor acc = Tensor::zeros({1}, DType::f64, x.device());
    sum_squares_into(x, acc);
    return acc.item();
  }
  const DType ct = compute_dtype(x.dtype());
  Tensor X = as_compute(x, ct);
  return cpu::dispatch_compute(ct, "sum_squares", [&](auto tv) {
    using T = decltype(tv);
    return cpu::sum_squares<T>(X.data<T>(), X.numel());
  });
}

void sum_squares_into(const Tensor& x, const Tensor& acc) {
  FSDP_CHECK(acc.numel() == 1 && acc.dtype() == DType::f64,
             "[sum_squares] the accumulator must be one f64, got {} {}", dtype_name(acc.dtype()),
             shape_str(acc.shape()));
  require_cpu("sum_squares", {&x, &acc});
  FSDP_CUDA_DISPATCH(("sum_squares", {&x, &acc}), sum_squares_into(x, acc));
  acc.data<double>()[0] += sum_squares(x);
}

void clip_scale_(const Tensor& x, const Tensor& total_sq, double max_norm) {
  FSDP_CHECK(total_sq.numel() == 1 && total_sq.dtype() == DType::f64,
             "[clip_grad_norm] the squared norm must be one f64, got {} {}",
             dtype_name(total_sq.dtype()), shape_str(total_sq.shape()));
  require_cpu("clip_grad_norm", {&x, &total_sq});
  FSDP_CUDA_DISPATCH(("clip_grad_norm", {&x, &total_sq}), clip_scale_(x, total_sq, max_norm));
  const double coef = max_norm / (std::sqrt(total_sq.data<double>()[0]) + 1e-6);
  if (coef < 1.0) scale_(x, coef);
}

void scale_(const Tensor& x, double s) {
  require_cpu("scale_", {&x});
  FSDP_CUDA_DISPATCH(("scale_", {&x}), scale_(x, s));
  const DType ct = compute_dtype(x.dtype());
  Accum X(x, ct);
  cpu::dispatch_compute(ct, "scale_", [&](auto tv) {
    using T = decltype(tv);
    cpu::scale<T>(X.data<T>(), T(s), x.numel());
  });
  X.finish();
}

// ---------------------------------------------------------------- loss

CrossEntropyOut cross_entropy_forward(const Tensor& logits, const Tensor& targets, bool read_loss) {
  FSDP_OP_SCOPE("cross_entropy", logits, ({&logits, &targets}), 3.0 * double(logits.numel()), 0);
  require_cpu("cross_entropy", {&logits, &targets});
  FSDP_CHECK(logits.dim() == 2, "[cross_entropy] logits must be [N, V], got {}",
             shape_str(logits.shape()));
  const int64_t n = logits.size(0), v = logits.size(1);
  FSDP_CHECK(targets.numel() == n, "[cross_entropy] {} targets for {} rows of logits",
             targets.numel(), n);
  FSDP_CHECK(n > 0, "[cross_entropy] no rows");
  FSDP_CUDA_DISPATCH(("cross_entropy", {&logits, &targets}),
                     cross_entropy_forward(logits, targets, read_loss));
  const DType ct = compute_dtype(logits.dtype());
  Tensor L = as_compute(logits, ct), Tg = targets.contiguous(), lse = Tensor::empty({n}, ct);
  double loss = cpu::dispatch_index(Tg.dtype(), "cross_entropy", [&](auto iv) {
    using Ix = decltype(iv);
    check_ids<Ix>("cross_entropy", Tg, v, "target");
    return cpu::dispatch_compute(ct, "cross_entropy", [&](auto tv) {
      using T = decltype(tv);
      return cpu::softmax_xent_forward<T, Ix>(L.data<T>(), Tg.data<Ix>(), lse.data<T>(), n, v);
    });
  });
  return {loss, lse, Tensor::full({1}, loss, DType::f64)};
}

namespace {

void check_xent_backward(const char* op, const Tensor& logits, const Tensor& targets,
                         const Tensor& lse) {
  require_cpu(op, {&logits, &targets, &lse});
  FSDP_CHECK(logits.dim() == 2, "[{}] logits must be [N, V], got {}", op,
             shape_str(logits.shape()));
  FSDP_CHECK(lse.numel() == logits.size(0) && targets.numel() == logits.size(0),
             "[{}] lse {} / targets {} for {} rows", op, lse.numel(), targets.numel(),
             logits.size(0));
}

// dlogits = softmax(logits) - onehot(targets), times dloss / N, into `out` (which may be
// `logits`: row by row, each element is read before it is written). Both in the compute dtype.
void xent_backward_cpu(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                       const Tensor& out, double dloss, DType ct) {
  const int64_t n = logits.size(0), v = logits.size(1);
  Tensor Tg = targets.contiguous(), LS = as_compute(lse, ct);
  cpu::dispatch_index(Tg.dtype(), "cross_entropy_backward", [&](auto iv) {
    using Ix = decltype(iv);
    cpu::dispatch_compute(ct, "cross_entropy_backward", [&](auto tv) {
      using T = decltype(tv);
      cpu::softmax_xent_backward<T, Ix>(logits.data<T>(), Tg.data<Ix>(), LS.data<T>(),
                                        out.data<T>(), dloss, n, v);
    });
  });
}

}  // namespace

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              double dloss) {
  FSDP_OP_SCOPE("cross_entropy_backward", logits, ({&logits, &targets}),
                3.0 * double(logits.numel()), logits.nbytes());
  check_xent_backward("cross_entropy_backward", logits, targets, lse);
  FSDP_CUDA_DISPATCH(("cross_entropy_backward", {&logits, &targets, &lse}),
                     cross_entropy_backward(logits, targets, lse, dloss));
  const DType ct = compute_dtype(logits.dtype());
  Tensor L = as_compute(logits, ct), d = Tensor::empty(logits.shape(), ct);
  xent_backward_cpu(L, targets, lse, d, dloss, ct);
  return as_storage(d, logits.dtype());
}

Tensor cross_entropy_backward_(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                               double dloss) {
  FSDP_OP_SCOPE("cross_entropy_backward_", logits, ({&logits, &targets}),
                3.0 * double(logits.numel()), logits.nbytes());
  check_xent_backward("cross_entropy_backward_", logits, targets, lse);
  FSDP_CHECK(logits.is_contiguous(), "[cross_entropy_backward_] logits {} must be contiguous",
             shape_str(logits.shape()));
  FSDP_CUDA_DISPATCH(("cross_entropy_backward_", {&logits, &targets, &lse}),
                     cross_entropy_backward_(logits, targets, lse, dloss));
  const DType ct = compute_dtype(logits.dtype());
  Tensor work = as_compute(logits, ct);  // the logits themselves when they are f32/f64
  xent_backward_cpu(work, targets, lse, work, dloss, ct);
  if (!work.shares_storage_with(logits)) logits.copy_(work);
  return logits;
}

// ---------------------------------------------------------------- copies

void copy_segments(const Tensor& dst, const Tensor& src, const std::vector<Segment>& segments) {
  FSDP_OP_SCOPE("copy_segments", dst, ({&src}), 0, dst.nbytes());
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
#ifdef FSDP_WITH_CUDA
  if (dst.device().is_cuda()) {
    std::vector<int64_t> d, s, c;
    for (const Segment& g : segments)
      d.push_back(g.dst_offset), s.push_back(g.src_offset), c.push_back(g.count);
    kernels::cuda::copy_segments(dst.raw_data(), dst.dtype(), src.raw_data(), src.dtype(), d.data(),
                                 s.data(), c.data(), int64_t(segments.size()), dst.device().index,
                                 cuda_compute_stream(dst.device().index));
    return;
  }
#endif
  require_cpu("copy_segments", {&dst, &src});
  for (const Segment& g : segments)
    if (g.count > 0)
      dst.slice(g.dst_offset, g.dst_offset + g.count)
          .copy_(src.slice(g.src_offset, g.src_offset + g.count));
}

// ---------------------------------------------------------------- optimizer

void adamw_(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
            const AdamWHyper& h, int64_t step) {
  FSDP_OP_SCOPE("adamw", param, ({&param, &grad, &m, &v}), 12.0 * double(param.numel()),
                3.0 * double(param.nbytes()));
  require_cpu("adamw", {&param, &grad, &m, &v});
  for (const Tensor* t : {&param, &grad, &m, &v}) {
    FSDP_CHECK(t->is_contiguous() && t->numel() == param.numel() && t->dtype() == param.dtype(),
               "[adamw] param, grad, exp_avg and exp_avg_sq must be contiguous {} buffers of {} "
               "elements; got {} "
               "{} elements",
               dtype_name(param.dtype()), param.numel(), dtype_name(t->dtype()), t->numel());
  }
  FSDP_CHECK(step >= 1, "[adamw] step must be >= 1, got {}", step);
  FSDP_CHECK(h.lr >= 0 && h.eps >= 0 && h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
             "[adamw] bad hyper-parameters lr {} betas ({}, {}) eps {}", h.lr, h.beta1, h.beta2,
             h.eps);
  FSDP_CUDA_DISPATCH(("adamw", {&param, &grad, &m, &v}), adamw_(param, grad, m, v, h, step));
  cpu::AdamWArgs a{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, step};
  cpu::dispatch_compute(param.dtype(), "adamw", [&](auto tv) {
    using T = decltype(tv);
    cpu::adamw<T>(param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), param.numel(), a);
  });
}

}  // namespace fsdp::ops
