// fsdp::ops on CPU tensors (src/ops/backend.h): shapes arrive checked by
// ops.cpp. Each op widens its inputs to the compute dtype (f32, or f64 for
// f64), runs kernels/cpu on contiguous buffers and narrows the output back to
// the storage dtype; saved statistics stay in the compute dtype.
//
// Compiled twice: here as cpu_impl over kernels/cpu, and by src/ops/meta_ops.cpp (FSDP_OPS_META)
// as meta_impl over src/ops/meta_kernels.h, whose kernels launch nothing: the meta backend makes
// what this code makes, on the meta device, and reads nothing on the host (kMeta below).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/ops/blas.h"
#include "kernels/cpu/cpu_kernels.h"
#include "src/core/dispatch.h"
#include "src/ops/backend.h"

#ifdef FSDP_OPS_META
#include "src/ops/meta_kernels.h"
#define FSDP_CPU_OPS_NAMESPACE meta_impl
#else
#define FSDP_CPU_OPS_NAMESPACE cpu_impl
#endif

namespace fsdp::ops::FSDP_CPU_OPS_NAMESPACE {

#ifdef FSDP_OPS_META
namespace cpu = kernels::meta;
constexpr bool kMeta = true;
#else
namespace cpu = kernels::cpu;
constexpr bool kMeta = false;
#endif

namespace {

// Where this backend's outputs live.
Device home() { return kMeta ? Device::meta() : Device::cpu(); }

// bf16 and f16 compute in f32; f32 and f64 compute as themselves. (The meta backend planning for
// CUDA counts these widened copies too, which CUDA's kernels do not make: an upper bound there.)
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

template <class I>
void check_ids(const char* op, const Tensor& ids, int64_t vocab, const char* what,
               std::optional<int64_t> allowed = std::nullopt) {
  if constexpr (kMeta) return;  // no values
  const I* p = ids.data<I>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    FSDP_CHECK((p[i] >= 0 && p[i] < vocab) || (allowed && int64_t(p[i]) == *allowed),
               "[{}] {} {} at position {} is outside [0, {}){}", op, what, int64_t(p[i]), i, vocab,
               allowed ? fmt::format(" and is not {}", *allowed) : "");
}

struct QkvDims {
  int64_t B, T, H, KV, hd;
};
QkvDims dims_of(const Tensor& qkv, int64_t heads, int64_t kv_heads) {
  const int64_t hd = qkv.size(2) / (heads + 2 * kv_heads);
  return {qkv.size(0), qkv.size(1), heads, kv_heads, hd};
}

// dlogits = softmax(logits) - onehot(targets), times dloss / N, into `out` (which may be
// `logits`: row by row, each element is read before it is written). Both in the compute dtype.
void xent_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                   const Tensor& out, double dloss, double divisor, DType ct) {
  const int64_t n = logits.size(0), v = logits.size(1);
  Tensor Tg = targets.contiguous(), LS = as_compute(lse, ct);
  dispatch_index(Tg.dtype(), "cross_entropy_backward", [&](auto iv) {
    using Ix = decltype(iv);
    dispatch_compute(ct, "cross_entropy_backward", [&](auto tv) {
      using T = decltype(tv);
      cpu::softmax_xent_backward<T, Ix>(logits.data<T>(), Tg.data<Ix>(), LS.data<T>(),
                                        out.data<T>(), dloss, divisor, n, v);
    });
  });
}

// bf16 x bf16 -> f32 products on this CPU's AVX512_BF16 dot products (kernels/cpu/gemm_bf16.cpp),
// where both operands are stored in bf16 and the CPU has them (FSDP_BF16_GEMM=0 turns it off, for
// comparison): no widened f32 copies of them are made. Elsewhere bf16 computes on f32 copies.
bool bf16_gemm(const Tensor& a, const Tensor& b) {
  return a.dtype() == DType::bf16 && b.dtype() == DType::bf16 && bf16_gemm_native();
}
const uint16_t* bits(const Tensor& t) { return kMeta ? nullptr : &t.data<bf16>()->bits; }

// C (f32 or bf16; an f32 work copy of a bf16 one) = alpha * op(A) op(B) + beta * C on bf16 A, B.
void gemm_bf16_into(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c,
                    double alpha, double beta) {
  const int64_t m = c.size(0), n = c.size(1), k = ta ? a.size(0) : a.size(1);
  Tensor A = a.contiguous(), B = b.contiguous();
  Accum C(c, DType::f32);
  cpu::gemm_bf16(ta, tb, m, n, k, float(alpha), bits(A), a.size(1), bits(B), b.size(1),
                 float(beta), C.data<float>(), n);
  C.finish();
}

}  // namespace

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,
          double beta) {
  if (bf16_gemm(a, b)) return gemm_bf16_into(a, ta, b, tb, c, alpha, beta);
  const int64_t m = c.size(0), n = c.size(1), k = ta ? a.size(0) : a.size(1);
  const DType ct = compute_dtype(a.dtype());
  Tensor A = as_compute(a, ct), B = as_compute(b, ct);
  Accum C(c, ct);
  dispatch_compute(ct, "gemm", [&](auto tv) {
    using T = decltype(tv);
    cpu::gemm<T>(ta, tb, m, n, k, T(alpha), A.data<T>(), a.size(1), B.data<T>(), b.size(1), T(beta),
                 C.data<T>(), n);
  });
  C.finish();
}

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / std::max<int64_t>(in, 1);
  const DType ct = compute_dtype(x.dtype());
  if (bf16_gemm(x, w)) {
    Tensor X = x.contiguous(), W = w.contiguous();
    Shape ys = x.shape();
    ys.back() = out;
    Tensor y = Tensor::empty(ys, ct, home());
    cpu::gemm_bf16(false, true, rows, out, in, 1.0f, bits(X), in, bits(W), in, 0.0f,
                   y.data<float>(), out);
    if (b.defined())
      cpu::bias_add_rows<float>(y.data<float>(), as_compute(b, ct).data<float>(), rows, out);
    return as_storage(y, x.dtype());
  }
  Tensor X = as_compute(x, ct), W = as_compute(w, ct);
  Shape ys = x.shape();
  ys.back() = out;
  Tensor y = Tensor::empty(ys, ct, home());
  dispatch_compute(ct, "linear", [&](auto tv) {
    using T = decltype(tv);
    cpu::gemm<T>(false, true, rows, out, in, T(1), X.data<T>(), in, W.data<T>(), in, T(0),
                 y.data<T>(), out);
    if (b.defined()) cpu::bias_add_rows<T>(y.data<T>(), as_compute(b, ct).data<T>(), rows, out);
  });
  return as_storage(y, x.dtype());
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dw,
                       const Tensor& db) {
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / std::max<int64_t>(in, 1);
  const DType ct = compute_dtype(x.dtype());
  if (bf16_gemm(x, w) && dy.dtype() == DType::bf16) {
    Tensor DY = dy.contiguous(), X = x.contiguous(), W = w.contiguous();
    Tensor dx = Tensor::empty(x.shape(), ct, home());
    Accum DW(dw, ct), DB(db, ct);
    cpu::gemm_bf16(false, false, rows, in, out, 1.0f, bits(DY), out, bits(W), in, 0.0f,
                   dx.data<float>(), in);
    if (dw.defined())
      cpu::gemm_bf16(true, false, out, in, rows, 1.0f, bits(DY), out, bits(X), in, 1.0f,
                     DW.data<float>(), in);
    if (db.defined())
      cpu::sum_rows_into<float>(as_compute(DY, ct).data<float>(), DB.data<float>(), rows, out);
    DW.finish();
    DB.finish();
    return as_storage(dx, x.dtype());
  }
  Tensor DY = as_compute(dy, ct), X = as_compute(x, ct), W = as_compute(w, ct);
  Tensor dx = Tensor::empty(x.shape(), ct, home());
  Accum DW(dw, ct), DB(db, ct);
  dispatch_compute(ct, "linear_backward", [&](auto tv) {
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

Tensor embedding_forward(const Tensor& ids, const Tensor& w) {
  const int64_t vocab = w.size(0), dim = w.size(1);
  Tensor I = ids.contiguous();
  const DType ct = compute_dtype(w.dtype());
  Tensor W = as_compute(w, ct);
  Shape ys = ids.shape();
  ys.push_back(dim);
  Tensor y = Tensor::empty(ys, ct, home());
  dispatch_index(I.dtype(), "embedding", [&](auto iv) {
    using Ix = decltype(iv);
    check_ids<Ix>("embedding", I, vocab, "token id");
    dispatch_compute(ct, "embedding", [&](auto tv) {
      using T = decltype(tv);
      cpu::embedding_forward<T, Ix>(I.data<Ix>(), W.data<T>(), y.data<T>(), I.numel(), dim);
    });
  });
  return as_storage(y, w.dtype());
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dw) {
  const int64_t dim = dw.size(1);
  Tensor I = ids.contiguous();
  const DType ct = compute_dtype(dw.dtype());
  Tensor DY = as_compute(dy, ct);
  Accum DW(dw, ct);
  dispatch_index(I.dtype(), "embedding_backward", [&](auto iv) {
    using Ix = decltype(iv);
    check_ids<Ix>("embedding_backward", I, dw.size(0), "token id");
    dispatch_compute(ct, "embedding_backward", [&](auto tv) {
      using T = decltype(tv);
      cpu::embedding_backward<T, Ix>(I.data<Ix>(), DY.data<T>(), DW.data<T>(), I.numel(), dim);
    });
  });
  DW.finish();
}

namespace {
// The weight in the compute dtype, plus w_offset (a copy: never the caller's weight).
Tensor offset_weight(const Tensor& w, DType ct, double w_offset) {
  Tensor W = as_compute(w, ct);
  if (w_offset == 0.0) return W;
  Tensor out = W.clone();
  dispatch_compute(ct, "rmsnorm", [&](auto tv) {
    using T = decltype(tv);
    T* p = out.data<T>();
    if (!kMeta)
      for (int64_t i = 0; i < out.numel(); ++i) p[i] += T(w_offset);
  });
  return out;
}
}  // namespace

RMSNormOut rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, double w_offset) {
  const int64_t dim = w.size(0), rows = x.numel() / std::max<int64_t>(dim, 1);
  const DType ct = compute_dtype(x.dtype());
  Tensor X = as_compute(x, ct), W = offset_weight(w, ct, w_offset);
  Tensor y = Tensor::empty(x.shape(), ct, home()), rstd = Tensor::empty({rows}, ct, home());
  dispatch_compute(ct, "rmsnorm", [&](auto tv) {
    using T = decltype(tv);
    cpu::rmsnorm_forward<T>(X.data<T>(), W.data<T>(), y.data<T>(), rstd.data<T>(), rows, dim, eps);
  });
  return {as_storage(y, x.dtype()), rstd};
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        const Tensor& dw, double w_offset) {
  const int64_t dim = w.size(0), rows = x.numel() / std::max<int64_t>(dim, 1);
  const DType ct = compute_dtype(x.dtype());
  Tensor DY = as_compute(dy, ct), X = as_compute(x, ct), W = offset_weight(w, ct, w_offset),
         R = as_compute(rstd, ct);
  Tensor dx = Tensor::empty(x.shape(), ct, home());
  Accum DW(dw, ct);
  dispatch_compute(ct, "rmsnorm_backward", [&](auto tv) {
    using T = decltype(tv);
    Tensor scratch;
    T* dwp = DW.data<T>();
    if (!dwp) {  // no weight gradient wanted: reduce into a scratch buffer
      scratch = Tensor::zeros({dim}, ct, home());
      dwp = scratch.data<T>();
    }
    cpu::rmsnorm_backward<T>(DY.data<T>(), X.data<T>(), W.data<T>(), R.data<T>(), dx.data<T>(), dwp,
                             rows, dim);
  });
  DW.finish();
  return as_storage(dx, x.dtype());
}

Tensor silu_forward(const Tensor& x) {
  const DType ct = compute_dtype(x.dtype());
  Tensor X = as_compute(x, ct), y = Tensor::empty(x.shape(), ct, home());
  dispatch_compute(ct, "silu", [&](auto tv) {
    using T = decltype(tv);
    cpu::silu_forward<T>(X.data<T>(), y.data<T>(), x.numel());
  });
  return as_storage(y, x.dtype());
}

Tensor silu_backward(const Tensor& dy, const Tensor& x) {
  const DType ct = compute_dtype(x.dtype());
  Tensor DY = as_compute(dy, ct), X = as_compute(x, ct), dx = Tensor::empty(x.shape(), ct, home());
  dispatch_compute(ct, "silu_backward", [&](auto tv) {
    using T = decltype(tv);
    cpu::silu_backward<T>(DY.data<T>(), X.data<T>(), dx.data<T>(), x.numel());
  });
  return as_storage(dx, x.dtype());
}

Tensor swiglu_forward(const Tensor& g, const Tensor& u, Gate act) {
  const DType ct = compute_dtype(g.dtype());
  Tensor G = as_compute(g, ct), U = as_compute(u, ct), y = Tensor::empty(g.shape(), ct, home());
  dispatch_compute(ct, "swiglu", [&](auto tv) {
    using T = decltype(tv);
    cpu::swiglu_forward<T>(G.data<T>(), U.data<T>(), y.data<T>(), y.numel(),
                           act == Gate::gelu_tanh);
  });
  return as_storage(y, g.dtype());
}

TensorPair swiglu_backward(const Tensor& dy, const Tensor& g, const Tensor& u, Gate act) {
  const DType ct = compute_dtype(g.dtype());
  Tensor DY = as_compute(dy, ct), G = as_compute(g, ct), U = as_compute(u, ct);
  Tensor dg = Tensor::empty(g.shape(), ct, home()), du = Tensor::empty(g.shape(), ct, home());
  dispatch_compute(ct, "swiglu_backward", [&](auto tv) {
    using T = decltype(tv);
    cpu::swiglu_backward<T>(DY.data<T>(), G.data<T>(), U.data<T>(), dg.data<T>(), du.data<T>(),
                            dg.numel(), act == Gate::gelu_tanh);
  });
  return {as_storage(dg, g.dtype()), as_storage(du, g.dtype())};
}

namespace {
const int32_t* doc_start_ptr(const Tensor& ds, Tensor& keep) {
  if (!ds.defined()) return nullptr;
  keep = ds.contiguous();
  return keep.data<int32_t>();
}
}  // namespace

void rope_(const Tensor& qkv, int64_t heads, int64_t kv_heads, const std::vector<double>& freqs,
           bool inverse, int64_t offset, const Tensor& doc_start) {
  Tensor ds;
  const int32_t* dsp = doc_start_ptr(doc_start, ds);
  const QkvDims d = dims_of(qkv, heads, kv_heads);
  const DType ct = compute_dtype(qkv.dtype());
  Accum Q(qkv, ct);  // in place; bf16/f16 round-trip through f32
  dispatch_compute(ct, "rope", [&](auto tv) {
    using T = decltype(tv);
    cpu::rope_qkv<T>(Q.data<T>(), d.B, d.T, d.H, d.KV, d.hd, freqs.data(), inverse, offset, dsp);
  });
  Q.finish();
}

AttentionOut attention_forward(const Tensor& qkv, int64_t heads, int64_t kv_heads, bool causal,
                               const Tensor& doc_start, int64_t window) {
  const QkvDims d = dims_of(qkv, heads, kv_heads);
  Tensor ds;
  const int32_t* dsp = doc_start_ptr(doc_start, ds);
  const DType ct = compute_dtype(qkv.dtype());
  Tensor Q = as_compute(qkv, ct);
  Tensor out = Tensor::empty({d.B, d.T, d.H * d.hd}, ct, home()),
         lse = Tensor::empty({d.B, d.H, d.T}, ct, home());
  dispatch_compute(ct, "attention", [&](auto tv) {
    using T = decltype(tv);
    cpu::attention_forward<T>(Q.data<T>(), out.data<T>(), lse.data<T>(), d.B, d.T, d.H, d.KV, d.hd,
                              causal, dsp, window);
  });
  return {as_storage(out, qkv.dtype()), lse};
}

Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int64_t heads, int64_t kv_heads, bool causal,
                          const Tensor& doc_start, int64_t window) {
  const QkvDims d = dims_of(qkv, heads, kv_heads);
  Tensor ds;
  const int32_t* dsp = doc_start_ptr(doc_start, ds);
  const DType ct = compute_dtype(qkv.dtype());
  Tensor DO = as_compute(dout, ct), Q = as_compute(qkv, ct), O = as_compute(out, ct),
         L = as_compute(lse, ct);
  Tensor dqkv = Tensor::empty(qkv.shape(), ct, home());
  dispatch_compute(ct, "attention_backward", [&](auto tv) {
    using T = decltype(tv);
    cpu::attention_backward<T>(DO.data<T>(), Q.data<T>(), O.data<T>(), L.data<T>(), dqkv.data<T>(),
                               d.B, d.T, d.H, d.KV, d.hd, causal, dsp, window);
  });
  return as_storage(dqkv, qkv.dtype());
}

Tensor attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads,
                        int64_t kv_heads, int64_t past, int64_t window) {
  const DType ct = compute_dtype(q.dtype());
  Tensor Q = as_compute(q, ct), K = as_compute(k, ct), V = as_compute(v, ct);
  Tensor out = Tensor::empty(q.shape(), ct, home());
  dispatch_compute(ct, "attention_decode", [&](auto tv) {
    using T = decltype(tv);
    cpu::attention_decode<T>(Q.data<T>(), K.data<T>(), V.data<T>(), out.data<T>(), q.size(0), heads,
                             kv_heads, q.size(1) / heads, past, window);
  });
  return as_storage(out, q.dtype());
}

Tensor add(const Tensor& a, const Tensor& b) {
  const DType ct = compute_dtype(a.dtype());
  Tensor A = as_compute(a, ct), B = as_compute(b, ct), out = Tensor::empty(a.shape(), ct, home());
  dispatch_compute(ct, "add", [&](auto tv) {
    using T = decltype(tv);
    cpu::add<T>(A.data<T>(), B.data<T>(), out.data<T>(), a.numel());
  });
  return as_storage(out, a.dtype());
}

void add_(const Tensor& a, const Tensor& b) {
  const DType ct = compute_dtype(a.dtype());
  Accum A(a, ct);
  Tensor B = as_compute(b, ct);
  dispatch_compute(ct, "add_", [&](auto tv) {
    using T = decltype(tv);
    cpu::add_inplace<T>(A.data<T>(), B.data<T>(), a.numel());
  });
  A.finish();
}

void sum_squares_into(const Tensor& x, const Tensor& acc) {
  const DType ct = compute_dtype(x.dtype());
  Tensor X = as_compute(x, ct);
  const double sq = dispatch_compute(ct, "sum_squares", [&](auto tv) {
    using T = decltype(tv);
    return cpu::sum_squares<T>(X.data<T>(), X.numel());
  });
  if (!kMeta) acc.data<double>()[0] += sq;
}

void scale_(const Tensor& x, double s) {
  const DType ct = compute_dtype(x.dtype());
  Accum X(x, ct);
  dispatch_compute(ct, "scale_", [&](auto tv) {
    using T = decltype(tv);
    cpu::scale<T>(X.data<T>(), T(s), x.numel());
  });
  X.finish();
}

void clip_scale_(const Tensor& x, const Tensor& total_sq, double max_norm) {
  if (kMeta) return scale_(x, 0.5);  // what a clipping step allocates
  const double coef = max_norm / (std::sqrt(total_sq.data<double>()[0]) + 1e-6);
  if (coef < 1.0) scale_(x, coef);
}

CrossEntropyOut cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                      bool /*read_loss: the loss is on the host already*/,
                                      double divisor) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const DType ct = compute_dtype(logits.dtype());
  Tensor L = as_compute(logits, ct), Tg = targets.contiguous(),
         lse = Tensor::empty({n}, ct, home());
  double loss = dispatch_index(Tg.dtype(), "cross_entropy", [&](auto iv) {
    using Ix = decltype(iv);
    check_ids<Ix>("cross_entropy", Tg, v, "target", kIgnoreIndex);
    return dispatch_compute(ct, "cross_entropy", [&](auto tv) {
      using T = decltype(tv);
      return cpu::softmax_xent_forward<T, Ix>(L.data<T>(), Tg.data<Ix>(), lse.data<T>(), n, v,
                                              divisor);
    });
  });
  return {loss, lse, Tensor::full({1}, loss, DType::f64, home())};
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              double dloss, double divisor) {
  const DType ct = compute_dtype(logits.dtype());
  Tensor L = as_compute(logits, ct), d = Tensor::empty(logits.shape(), ct, home());
  xent_backward(L, targets, lse, d, dloss, divisor, ct);
  return as_storage(d, logits.dtype());
}

Tensor cross_entropy_backward_(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                               double dloss, double divisor) {
  const DType ct = compute_dtype(logits.dtype());
  Tensor work = as_compute(logits, ct);  // the logits themselves when they are f32/f64
  xent_backward(work, targets, lse, work, dloss, divisor, ct);
  if (!work.shares_storage_with(logits)) logits.copy_(work);
  return logits;
}

void copy_segments(const Tensor& dst, const Tensor& src, const std::vector<Segment>& segments) {
  for (const Segment& g : segments)
    if (g.count > 0)
      dst.slice(g.dst_offset, g.dst_offset + g.count)
          .copy_(src.slice(g.src_offset, g.src_offset + g.count));
}

void adamw_multi_(const std::vector<AdamWTensors>& ts, const AdamWHyper& h, int64_t step,
                  const GradClip& clip) {
  const cpu::AdamWArgs a{h.lr, h.beta1, h.beta2, h.eps, step};
  // clip_scale_'s factor (a meta run computes nothing and reads no norm).
  double coef = 1.0;
  if (!kMeta && clip.total_sq.defined())
    coef = std::min(1.0, clip.max_norm / (std::sqrt(clip.total_sq.data<double>()[0]) + 1e-6));
  dispatch_compute(ts.front().param.dtype(), "adamw", [&](auto tv) {
    using T = decltype(tv);
    std::vector<cpu::AdamWSpan<T>> spans;
    for (const AdamWTensors& t : ts)
      spans.push_back({t.param.data<T>(), t.grad.data<T>(), t.exp_avg.data<T>(),
                       t.exp_avg_sq.data<T>(), t.param.numel(), t.weight_decay});
    cpu::adamw_multi<T>(spans.data(), int64_t(spans.size()), a, T(coef));
  });
}

}  // namespace fsdp::ops::FSDP_CPU_OPS_NAMESPACE

#undef FSDP_CPU_OPS_NAMESPACE
