// fsdp::ops on CUDA tensors: layout and dtype checks, output allocation, and
// the launches of kernels/cuda. Inputs of one op share one storage dtype
// (f32, bf16 or f16); parameter gradients may be wider (reduce_dtype).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "src/ops/backend.h"

namespace fsdp::ops::cuda_impl {

namespace kc = kernels::cuda;

namespace {

int dev(const Tensor& t) { return t.device().index; }
// The device's compute stream: every launch here goes on it.
kc::Stream cs(const Tensor& t) { return cuda_compute_stream(t.device().index); }

Tensor dense(const Tensor& t) { return t.contiguous(); }

// Scratch bytes from the caching allocator (so peak memory counts them); none for 0.
Tensor workspace(int64_t bytes, Device d) {
  return bytes > 0 ? Tensor::empty({(bytes + 7) / 8}, DType::i64, d) : Tensor();
}

void same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  FSDP_CHECK(a.dtype() == b.dtype(), "[{}] on CUDA the inputs share one dtype; got {} and {}", op,
             dtype_name(a.dtype()), dtype_name(b.dtype()));
}

// A gradient buffer to add into in place: it must be contiguous.
void check_grad(const char* op, const Tensor& g) {
  if (g.defined())
    FSDP_CHECK(g.is_contiguous(), "[{}] a CUDA gradient buffer must be contiguous", op);
}

}  // namespace

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,
          double beta) {
  same_dtype("gemm", a, b);
  same_dtype("gemm", a, c);
  FSDP_CHECK(c.is_contiguous(), "[gemm] C must be contiguous");
  Tensor A = dense(a), B = dense(b);
  const int64_t m = c.size(0), n = c.size(1), k = ta ? a.size(0) : a.size(1);
  kc::gemm(ta, tb, m, n, k, float(alpha), A.raw_data(), B.raw_data(), float(beta), c.raw_data(),
           a.dtype(), nullptr, dev(c), cs(c));
}

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  same_dtype("linear", x, w);
  if (b.defined()) same_dtype("linear", x, b);
  Tensor X = dense(x), W = dense(w), Bb = b.defined() ? dense(b) : Tensor();
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / std::max<int64_t>(in, 1);
  Shape ys = x.shape();
  ys.back() = out;
  Tensor y = Tensor::empty(ys, x.dtype(), x.device());
  kc::gemm(false, true, rows, out, in, 1.f, X.raw_data(), W.raw_data(), 0.f, y.raw_data(),
           x.dtype(), Bb.defined() ? Bb.raw_data() : nullptr, dev(x), cs(x));
  return y;
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dw,
                       const Tensor& db) {
  check_grad("linear_backward", dw);
  check_grad("linear_backward", db);
  Tensor DY = dense(dy.to(x.dtype())), X = dense(x), W = dense(w);
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / std::max<int64_t>(in, 1);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  kc::gemm(false, false, rows, in, out, 1.f, DY.raw_data(), W.raw_data(), 0.f, dx.raw_data(),
           x.dtype(), nullptr, dev(x), cs(x));
  bool db_done = !db.defined();
  if (dw.defined()) {
    kc::GemmArgs g;  // dW[out, in] += dY^T X
    g.ta = true;
    g.m = out, g.n = in, g.k = rows;
    g.beta = 1.f;
    g.a = DY.raw_data(), g.b = X.raw_data(), g.c = dw.raw_data();
    g.t = x.dtype();
    g.device = dev(x);
    if (dw.dtype() == x.dtype() || dw.dtype() == DType::f32) {
      // dW accumulates straight into the gradient, f32 under bf16 inputs; the bias gradient
      // comes from the same GEMM's epilogue where cuBLASLt offers it (it writes, so into a
      // small buffer that is then added).
      g.c_t = dw.dtype();
      Tensor part = db.defined() ? Tensor::empty({out}, dw.dtype(), x.device()) : Tensor();
      if (part.defined() && kc::gemm_bgrad(g, part.raw_data(), cs(x))) {
        kc::add_inplace(db.raw_data(), db.dtype(), part.raw_data(), part.dtype(), out, dev(x),
                        cs(x));
        db_done = true;
      } else {
        kc::gemm(g, cs(x));
      }
    } else {  // another gradient dtype: compute in the input dtype, then add
      Tensor tmp = Tensor::empty(dw.shape(), x.dtype(), x.device());
      g.beta = 0.f;
      g.c = tmp.raw_data();
      kc::gemm(g, cs(x));
      kc::add_inplace(dw.raw_data(), dw.dtype(), tmp.raw_data(), tmp.dtype(), dw.numel(), dev(x),
                      cs(x));
    }
  }
  if (!db_done)
    kc::sum_rows_into(DY.raw_data(), DY.dtype(), db.raw_data(), db.dtype(), rows, out, dev(x),
                      cs(x));
  return dx;
}

Tensor embedding_forward(const Tensor& ids, const Tensor& w) {
  Tensor I = dense(ids), W = dense(w);
  Shape ys = ids.shape();
  ys.push_back(w.size(1));
  Tensor y = Tensor::empty(ys, w.dtype(), w.device());
  kc::embedding_forward(I.raw_data(), I.dtype(), W.raw_data(), y.raw_data(), w.dtype(), I.numel(),
                        w.size(0), w.size(1), dev(w), cs(w));
  return y;
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dw) {
  check_grad("embedding_backward", dw);
  Tensor I = dense(ids), DY = dense(dy);
  kc::embedding_backward(I.raw_data(), I.dtype(), DY.raw_data(), DY.dtype(), dw.raw_data(),
                         dw.dtype(), I.numel(), dw.size(0), dw.size(1), dev(dw), cs(dw));
}

RMSNormOut rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, double w_offset) {
  same_dtype("rmsnorm", x, w);
  Tensor X = dense(x), W = dense(w);
  const int64_t dim = w.size(0), rows = x.numel() / std::max<int64_t>(dim, 1);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device()),
         rstd = Tensor::empty({rows}, DType::f32, x.device());
  kc::rmsnorm_forward(X.raw_data(), W.raw_data(), y.raw_data(), rstd.data<float>(), x.dtype(), rows,
                      dim, eps, float(w_offset), dev(x), cs(x));
  return {y, rstd};
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        const Tensor& dw, double w_offset) {
  check_grad("rmsnorm_backward", dw);
  Tensor DY = dense(dy.to(x.dtype())), X = dense(x), W = dense(w), R = dense(rstd.to(DType::f32));
  const int64_t dim = w.size(0), rows = x.numel() / std::max<int64_t>(dim, 1);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor scratch = dw.defined() ? Tensor::empty({kc::rmsnorm_backward_scratch(rows, dim, dev(x))},
                                                DType::f32, x.device())
                                : Tensor();
  kc::rmsnorm_backward(DY.raw_data(), X.raw_data(), W.raw_data(), R.data<float>(), dx.raw_data(),
                       dw.defined() ? dw.raw_data() : nullptr,
                       dw.defined() ? dw.dtype() : DType::f32,
                       scratch.defined() ? scratch.data<float>() : nullptr, x.dtype(), rows, dim,
                       float(w_offset), dev(x), cs(x));
  return dx;
}

Tensor silu_forward(const Tensor& x) {
  Tensor X = dense(x), y = Tensor::empty(x.shape(), x.dtype(), x.device());
  kc::silu_forward(X.raw_data(), y.raw_data(), x.dtype(), x.numel(), dev(x), cs(x));
  return y;
}

Tensor silu_backward(const Tensor& dy, const Tensor& x) {
  Tensor DY = dense(dy.to(x.dtype())), X = dense(x),
         dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  kc::silu_backward(DY.raw_data(), X.raw_data(), dx.raw_data(), x.dtype(), x.numel(), dev(x),
                    cs(x));
  return dx;
}

Tensor swiglu_forward(const Tensor& g, const Tensor& u, Gate act) {
  same_dtype("swiglu", g, u);
  Tensor G = dense(g), U = dense(u), y = Tensor::empty(g.shape(), g.dtype(), g.device());
  kc::swiglu_forward(G.raw_data(), U.raw_data(), y.raw_data(), g.dtype(), g.numel(),
                     act == Gate::gelu_tanh, dev(g), cs(g));
  return y;
}

std::pair<Tensor, Tensor> swiglu_backward(const Tensor& dy, const Tensor& g, const Tensor& u,
                                          Gate act) {
  Tensor DY = dense(dy.to(g.dtype())), G = dense(g), U = dense(u);
  Tensor dg = Tensor::empty(g.shape(), g.dtype(), g.device()),
         du = Tensor::empty(g.shape(), g.dtype(), g.device());
  kc::swiglu_backward(DY.raw_data(), G.raw_data(), U.raw_data(), dg.raw_data(), du.raw_data(),
                      g.dtype(), g.numel(), act == Gate::gelu_tanh, dev(g), cs(g));
  return {dg, du};
}

namespace {
const int32_t* doc_start_ptr(const Tensor& ds, Tensor& keep) {
  if (!ds.defined()) return nullptr;
  keep = dense(ds);
  return keep.data<int32_t>();
}
}  // namespace

void rope_(const Tensor& qkv, int64_t heads, int64_t kv_heads, const std::vector<double>& freqs,
           bool inverse, int64_t offset, const Tensor& doc_start) {
  FSDP_CHECK(qkv.is_contiguous(), "[rope] a CUDA qkv must be contiguous");
  const int64_t hd = qkv.size(2) / (heads + 2 * kv_heads);
  FSDP_CHECK(hd / 2 <= kc::kMaxRopePairs,
             "[rope] CUDA's rotary embedding takes head dims up to {}, got {}",
             2 * kc::kMaxRopePairs, hd);
  Tensor ds;
  kc::rope_qkv(qkv.raw_data(), qkv.dtype(), qkv.size(0), qkv.size(1), heads, kv_heads, hd,
               freqs.data(), inverse, offset, doc_start_ptr(doc_start, ds), dev(qkv), cs(qkv));
}

// Packed rows run on our kernel: cuDNN's SDPA takes packed rows only as ragged (THD) sequences,
// which this layout is not. A sliding window is cuDNN's diagonal band where cuDNN takes the shape,
// else our kernel's.
AttentionOut attention_forward(const Tensor& qkv, int64_t heads, int64_t kv_heads, bool causal,
                               const Tensor& doc_start, int64_t window) {
  Tensor Q = dense(qkv);
  Tensor ds;
  const int32_t* dsp = doc_start_ptr(doc_start, ds);
  const int64_t B = qkv.size(0), T = qkv.size(1), hd = qkv.size(2) / (heads + 2 * kv_heads);
  Tensor out = Tensor::empty({B, T, heads * hd}, qkv.dtype(), qkv.device());
  Tensor lse = Tensor::empty({B, heads, T}, DType::f32, qkv.device());
  const int64_t ws = dsp ? -1
                         : kc::cudnn_attention_workspace(false, qkv.dtype(), B, T, heads, kv_heads,
                                                         hd, causal, window, dev(qkv));
  if (ws >= 0) {
    Tensor w = workspace(ws, qkv.device());
    kc::cudnn_attention_forward(Q.raw_data(), out.raw_data(), lse.data<float>(), qkv.dtype(), B, T,
                                heads, kv_heads, hd, causal, window,
                                w.defined() ? w.raw_data() : nullptr, dev(qkv), cs(qkv));
    return {out, lse};
  }
  kc::attention_forward(Q.raw_data(), out.raw_data(), lse.data<float>(), qkv.dtype(), B, T, heads,
                        kv_heads, hd, causal, dsp, window, dev(qkv), cs(qkv));
  return {out, lse};
}

Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int64_t heads, int64_t kv_heads, bool causal,
                          const Tensor& doc_start, int64_t window) {
  Tensor DO = dense(dout.to(qkv.dtype())), Q = dense(qkv), O = dense(out),
         L = dense(lse.to(DType::f32));
  Tensor ds;
  const int32_t* dsp = doc_start_ptr(doc_start, ds);
  const int64_t B = qkv.size(0), T = qkv.size(1), hd = qkv.size(2) / (heads + 2 * kv_heads);
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
  const int64_t ws = dsp ? -1
                         : kc::cudnn_attention_workspace(true, qkv.dtype(), B, T, heads, kv_heads,
                                                         hd, causal, window, dev(qkv));
  if (ws >= 0) {
    Tensor w = workspace(ws, qkv.device());
    kc::cudnn_attention_backward(DO.raw_data(), Q.raw_data(), O.raw_data(), L.data<float>(),
                                 dqkv.raw_data(), qkv.dtype(), B, T, heads, kv_heads, hd, causal,
                                 window, w.defined() ? w.raw_data() : nullptr, dev(qkv), cs(qkv));
    return dqkv;
  }
  kc::attention_backward(DO.raw_data(), Q.raw_data(), O.raw_data(), L.data<float>(),
                         dqkv.raw_data(), qkv.dtype(), B, T, heads, kv_heads, hd, causal, dsp,
                         window, dev(qkv), cs(qkv));
  return dqkv;
}

Tensor attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads,
                        int64_t kv_heads, int64_t past, int64_t window) {
  Tensor Q = dense(q), K = dense(k), V = dense(v);
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  kc::attention_decode(Q.raw_data(), K.raw_data(), V.raw_data(), out.raw_data(), q.dtype(),
                       q.size(0), heads, kv_heads, q.size(1) / heads, past, window, dev(q), cs(q));
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  same_dtype("add", a, b);
  Tensor A = dense(a), B = dense(b), out = Tensor::empty(a.shape(), a.dtype(), a.device());
  kc::add(A.raw_data(), B.raw_data(), out.raw_data(), a.dtype(), a.numel(), dev(a), cs(a));
  return out;
}

void add_(const Tensor& a, const Tensor& b) {
  FSDP_CHECK(a.is_contiguous(), "[add_] a CUDA destination must be contiguous");
  Tensor B = dense(b);
  kc::add_inplace(a.raw_data(), a.dtype(), B.raw_data(), B.dtype(), a.numel(), dev(a), cs(a));
}

void sum_squares_into(const Tensor& x, const Tensor& acc) {
  FSDP_CHECK(acc.numel() == 1 && acc.dtype() == DType::f64 && acc.device() == x.device(),
             "[sum_squares] the accumulator must be one f64 on {}", x.device().str());
  Tensor X = dense(x);
  kc::sum_squares_into(X.raw_data(), X.dtype(), X.numel(), acc.data<double>(), dev(x), cs(x));
}

void clip_scale_(const Tensor& x, const Tensor& total_sq, double max_norm) {
  FSDP_CHECK(x.is_contiguous(), "[clip_grad_norm] a CUDA gradient must be contiguous");
  kc::clip_scale(x.raw_data(), x.dtype(), x.numel(), total_sq.data<double>(), max_norm, dev(x),
                 cs(x));
}

void scale_(const Tensor& x, double s) {
  FSDP_CHECK(x.is_contiguous(), "[scale_] a CUDA tensor must be contiguous");
  kc::scale(x.raw_data(), x.dtype(), s, x.numel(), dev(x), cs(x));
}

CrossEntropyOut cross_entropy_forward(const Tensor& logits, const Tensor& targets, bool read_loss,
                                      double divisor) {
  Tensor L = dense(logits), Tg = dense(targets);
  const int64_t n = logits.size(0), v = logits.size(1);
  Tensor lse = Tensor::empty({n}, DType::f32, logits.device());
  Tensor loss = Tensor::empty({1}, DType::f64, logits.device());
  kc::softmax_xent_forward(L.raw_data(), Tg.raw_data(), Tg.dtype(), lse.data<float>(),
                           loss.data<double>(), logits.dtype(), n, v, divisor, dev(logits),
                           cs(logits));
  return {read_loss ? loss.item() : std::numeric_limits<double>::quiet_NaN(), lse, loss};
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              double dloss, double divisor) {
  Tensor L = dense(logits), Tg = dense(targets), LS = dense(lse.to(DType::f32));
  const int64_t n = logits.size(0), v = logits.size(1);
  Tensor d = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  kc::softmax_xent_backward(L.raw_data(), Tg.raw_data(), Tg.dtype(), LS.data<float>(), d.raw_data(),
                            logits.dtype(), dloss, divisor, n, v, dev(logits), cs(logits));
  return d;
}

Tensor cross_entropy_backward_(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                               double dloss, double divisor) {
  // xent_bwd reads each logit once, then writes its gradient in the same place.
  Tensor Tg = dense(targets), LS = dense(lse.to(DType::f32));
  const int64_t n = logits.size(0), v = logits.size(1);
  kc::softmax_xent_backward(logits.raw_data(), Tg.raw_data(), Tg.dtype(), LS.data<float>(),
                            logits.raw_data(), logits.dtype(), dloss, divisor, n, v, dev(logits),
                            cs(logits));
  return logits;
}

void adamw_multi_(const std::vector<AdamWTensors>& ts, const AdamWHyper& h, int64_t step,
                  const GradClip& clip) {
  std::vector<kc::AdamWBuffers> bufs;
  for (const AdamWTensors& t : ts)
    bufs.push_back({t.param.raw_data(), t.grad.raw_data(), t.exp_avg.raw_data(),
                    t.exp_avg_sq.raw_data(), t.param.numel(), t.weight_decay});
  const Tensor& p = ts.front().param;
  kc::adamw_multi(bufs.data(), int64_t(bufs.size()), p.dtype(), h.lr, h.beta1, h.beta2, h.eps,
                  step, clip.total_sq.defined() ? clip.total_sq.data<double>() : nullptr,
                  clip.max_norm, dev(p), cs(p));
}

void copy_segments(const Tensor& dst, const Tensor& src, const std::vector<Segment>& segments) {
  std::vector<int64_t> d, s, c;
  for (const Segment& g : segments)
    d.push_back(g.dst_offset), s.push_back(g.src_offset), c.push_back(g.count);
  kc::copy_segments(dst.raw_data(), dst.dtype(), src.raw_data(), src.dtype(), d.data(), s.data(),
                    c.data(), int64_t(segments.size()), dev(dst), cs(dst));
}

Tensor moe_combine(const Tensor& rows, const Tensor& pos, const Tensor& weight, const Tensor& base,
                   int64_t k) {
  if (base.defined()) same_dtype("moe_combine", rows, base);
  const Tensor R = dense(rows), P = dense(pos), W = weight.defined() ? dense(weight) : Tensor(),
               B = base.defined() ? dense(base) : Tensor();
  const int64_t n = P.numel() / k, d = R.size(1);
  Tensor out = Tensor::empty({n, d}, rows.dtype(), rows.device());
  kc::moe_combine(R.raw_data(), P.data<int64_t>(), W.defined() ? W.data<double>() : nullptr,
                  B.defined() ? B.raw_data() : nullptr, out.raw_data(), rows.dtype(), R.size(0), n,
                  k, d, dev(rows), cs(rows));
  return out;
}

MoECombineGrad moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& pos,
                                    const Tensor& weight, int64_t k) {
  same_dtype("moe_combine_backward", rows, dout);
  const Tensor R = dense(rows), G = dense(dout), P = dense(pos),
               W = weight.defined() ? dense(weight) : Tensor();
  const int64_t n = P.numel() / k, d = R.size(1);
  Tensor drows = Tensor::zeros(rows.shape(), rows.dtype(), rows.device());
  Tensor dweight = Tensor::empty({n * k}, DType::f64, rows.device());
  kc::moe_combine_backward(G.raw_data(), R.raw_data(), P.data<int64_t>(),
                           W.defined() ? W.data<double>() : nullptr, drows.raw_data(),
                           dweight.data<double>(), rows.dtype(), R.size(0), n, k, d, dev(rows),
                           cs(rows));
  return {drows, dweight};
}

double gemm_peak_flops(Device device, DType dtype) {
  return kc::measure_gemm_flops(8192, dtype, device.index);
}

double copy_gbps(Device device) { return kc::measure_copy_gbps(int64_t(1) << 30, device.index); }

std::string attention_path(Device device, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                           int64_t hd, bool causal, int64_t window) {
  // The plans are cached: the step's own attention finds them built.
  const int d = device.index;
  const bool fwd = kc::cudnn_attention_workspace(false, t, B, T, H, KV, hd, causal, window, d) >= 0;
  const bool bwd = kc::cudnn_attention_workspace(true, t, B, T, H, KV, hd, causal, window, d) >= 0;
  // The cuDNN loaded beside the one compiled against: a graph refused at run time often comes
  // from an older cuDNN than the headers' (PyTorch's wheel, say).
  if (fwd && bwd) return "cuDNN SDPA (" + kc::cudnn_versions() + ")";
  return fmt::format("our kernel ({}; cuDNN refused the {} of B {} T {} H {} KV {} hd {} {}{}{}: {})",
                     kc::cudnn_versions(), fwd ? "backward" : "forward", B, T, H, KV, hd,
                     dtype_name(t), causal ? " causal" : "",
                     window > 0 ? fmt::format(" window {}", window) : std::string(),
                     kc::cudnn_attention_refusal(fwd, t, B, T, H, KV, hd, causal, window, d));
}

std::string device_name(Device device) {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, device.index) == cudaSuccess ? std::string(prop.name) : "";
}

}  // namespace fsdp::ops::cuda_impl
