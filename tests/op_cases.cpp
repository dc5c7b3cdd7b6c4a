// The op-case table (op_cases.h). Each op has one builder that makes a case from its shape: the
// inputs, the forward and backward through fsdp::ops, the f64 reference written out loop by
// loop, and the cost by src/ops/cost.h. op_cases() lists the correctness shapes, perf_cases() a
// model's.
#include "op_cases.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/nn/init.h"
#include "fsdp/ops/ops.h"
#include "fsdp/ops/rope.h"

namespace fsdp::test {

namespace {

namespace cost = ops::cost;
using Cost = cost::Cost;
using Tensors = std::vector<Tensor>;

Cost operator+(Cost a, Cost b) { return {a.flops + b.flops, a.bytes + b.bytes}; }

const std::vector<DType> kAll = {DType::f64, DType::f32, DType::bf16};
const std::vector<DType> kFull = {DType::f64, DType::f32};  // no half-precision path

std::vector<double> f64(const Tensor& t) { return t.to_f64_vector(); }
Tensor from(std::vector<double> v, const Shape& s) {
  return Tensor::from_vector<double>(std::move(v), s);
}
std::string dims(const Shape& s) {
  std::string r;
  for (int64_t v : s) r += (r.empty() ? "" : "x") + std::to_string(v);
  return r;
}

// ---------------------------------------------------------------- gemm

OpCase gemm_case(int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
  const double alpha = 0.5, beta = 2.0;
  OpCase c{.op = "gemm",
           .what = fmt::format("gemm {}x{}x{} ta={} tb={}", m, n, k, int(ta), int(tb)),
           .covers = {"gemm"},
           .dtypes = kFull,
           .inputs = {{ta ? Shape{k, m} : Shape{m, k}}, {tb ? Shape{n, k} : Shape{k, n}}, {{m, n}}}};
  c.forward = [=](const Tensors& in, bool in_place) {
    Tensor out = in_place ? in[2] : in[2].clone();
    ops::gemm(in[0], ta, in[1], tb, out, alpha, beta);
    return OpRun{{out}, {}};
  };
  c.reference = [=](const Tensors& in) {
    auto A = f64(in[0]), B = f64(in[1]), C = f64(in[2]);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += A[size_t(ta ? p * m + i : i * k + p)] * B[size_t(tb ? j * k + p : p * n + j)];
        C[size_t(i * n + j)] = alpha * s + beta * C[size_t(i * n + j)];
      }
    return Tensors{from(C, {m, n})};
  };
  c.forward_cost = [=](const Tensors& in, const OpRun& r) {
    return cost::gemm(in[0], ta, in[1], tb, r.out[0]);
  };
  return c;
}

// ---------------------------------------------------------------- linear

OpCase linear_case(const Shape& x, int64_t out, bool bias) {
  const int64_t in_f = x.back();
  OpCase c{.op = "linear",
           .what = fmt::format("linear {} -> {}{}", dims(x), out, bias ? " bias" : ""),
           .covers = {"linear_forward", "linear_backward"},
           .dtypes = kAll,
           .inputs = {{x, -1, 1, Grad::returned}, {{out, in_f}, -1, 1, Grad::accumulated}}};
  if (bias) c.inputs.push_back({{out}, -1, 1, Grad::accumulated});
  auto b_of = [bias](const Tensors& in) { return bias ? in[2] : Tensor(); };
  c.forward = [=](const Tensors& in, bool) {
    return OpRun{{ops::linear_forward(in[0], in[1], b_of(in))}, {}};
  };
  c.backward = [=](const BackwardArgs& a) {
    return Tensors{ops::linear_backward(a.dout, a.in[0], a.in[1], a.acc[0],
                                        bias ? a.acc[1] : Tensor())};
  };
  c.reference = [=](const Tensors& in) {
    auto X = f64(in[0]), W = f64(in[1]);
    std::vector<double> B = bias ? f64(in[2]) : std::vector<double>(size_t(out), 0.0);
    const int64_t rows = in[0].numel() / in_f;
    std::vector<double> Y(size_t(rows * out));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < out; ++j) {
        double s = B[size_t(j)];
        for (int64_t p = 0; p < in_f; ++p) s += X[size_t(r * in_f + p)] * W[size_t(j * in_f + p)];
        Y[size_t(r * out + j)] = s;
      }
    Shape ys = x;
    ys.back() = out;
    return Tensors{from(Y, ys)};
  };
  c.forward_cost = [=](const Tensors& in, const OpRun&) {
    return cost::linear_forward(in[0], in[1], b_of(in));
  };
  c.backward_cost = [](const BackwardArgs& a) {
    return cost::linear_backward(a.dout, a.in[0], a.in[1]);
  };
  return c;
}

// ---------------------------------------------------------------- embedding

OpCase embedding_case(const Shape& ids, int64_t vocab, int64_t dim) {
  OpCase c{.op = "embedding",
           .what = fmt::format("embedding {} of {}x{}", dims(ids), vocab, dim),
           .covers = {"embedding_forward", "embedding_backward"},
           .dtypes = kAll,
           .inputs = {{ids, 0, 0, Grad::none, vocab}, {{vocab, dim}, -1, 1, Grad::accumulated}},
           .ref_tol = 0};
  c.forward = [](const Tensors& in, bool) {
    return OpRun{{ops::embedding_forward(in[0], in[1])}, {}};
  };
  c.backward = [](const BackwardArgs& a) {
    ops::embedding_backward(a.dout, a.in[0], a.acc[0]);
    return Tensors{};
  };
  c.reference = [=](const Tensors& in) {
    auto I = f64(in[0]), W = f64(in[1]);
    std::vector<double> Y;
    for (double id : I)
      for (int64_t j = 0; j < dim; ++j) Y.push_back(W[size_t(int64_t(id) * dim + j)]);
    Shape ys = ids;
    ys.push_back(dim);
    return Tensors{from(Y, ys)};
  };
  c.forward_cost = [](const Tensors& in, const OpRun&) {
    return cost::embedding_forward(in[0], in[1]);
  };
  c.backward_cost = [](const BackwardArgs& a) { return cost::embedding_backward(a.dout, a.in[0]); };
  return c;
}

// ---------------------------------------------------------------- rmsnorm

// w_offset 1: Gemma's (1 + w), its weights near 0.
OpCase rmsnorm_case(int64_t rows, int64_t dim, int64_t fd_probes = 64, double w_offset = 0.0) {
  const double eps = 1e-5;
  OpCase c{.op = "rmsnorm",
           .what = fmt::format("rmsnorm {}x{}{}", rows, dim,
                               w_offset != 0.0 ? fmt::format(" (w + {:g})", w_offset) : ""),
           .covers = {"rmsnorm_forward", "rmsnorm_backward"},
           .dtypes = kAll,
           .inputs = {{{rows, dim}, -1, 1, Grad::returned},
                      {{dim}, 0.5 - w_offset, 1.5 - w_offset, Grad::accumulated}},
           .fd_probes = fd_probes};
  c.forward = [=](const Tensors& in, bool) {
    auto o = ops::rmsnorm_forward(in[0], in[1], eps, w_offset);
    return OpRun{{o.y}, {o.rstd}};
  };
  c.backward = [=](const BackwardArgs& a) {
    return Tensors{
        ops::rmsnorm_backward(a.dout, a.in[0], a.in[1], a.fwd.saved[0], a.acc[0], w_offset)};
  };
  c.reference = [=](const Tensors& in) {
    auto X = f64(in[0]), W = f64(in[1]);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t j = 0; j < dim; ++j) ss += X[size_t(r * dim + j)] * X[size_t(r * dim + j)];
      const double rs = 1.0 / std::sqrt(ss / double(dim) + eps);
      for (int64_t j = 0; j < dim; ++j) X[size_t(r * dim + j)] *= rs * (W[size_t(j)] + w_offset);
    }
    return Tensors{from(X, {rows, dim})};
  };
  c.forward_cost = [](const Tensors& in, const OpRun&) {
    return cost::rmsnorm_forward(in[0], in[1]);
  };
  c.backward_cost = [](const BackwardArgs& a) {
    return cost::rmsnorm_backward(a.dout, a.in[0], a.in[1]);
  };
  return c;
}

// ---------------------------------------------------------------- activations

double silu(double v) { return v / (1 + std::exp(-v)); }

OpCase silu_case(const Shape& s, double range) {
  OpCase c{.op = "silu",
           .what = fmt::format("silu {}", dims(s)),
           .covers = {"silu_forward", "silu_backward"},
           .dtypes = kAll,
           .inputs = {{s, -range, range, Grad::returned}},
           .ref_tol = 1e-14};
  c.forward = [](const Tensors& in, bool) { return OpRun{{ops::silu_forward(in[0])}, {}}; };
  c.backward = [](const BackwardArgs& a) { return Tensors{ops::silu_backward(a.dout, a.in[0])}; };
  c.reference = [=](const Tensors& in) {
    auto X = f64(in[0]);
    for (double& v : X) v = silu(v);
    return Tensors{from(X, s)};
  };
  c.forward_cost = [](const Tensors& in, const OpRun&) { return cost::silu_forward(in[0]); };
  c.backward_cost = [](const BackwardArgs& a) { return cost::silu_backward(a.dout, a.in[0]); };
  return c;
}

// gelu's tanh form (PyTorch's gelu(approximate="tanh"), Gemma's gelu_pytorch_tanh).
double gelu_tanh(double x) {
  return 0.5 * x *
         (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

OpCase swiglu_case(const Shape& s, double range, ops::Gate act = ops::Gate::silu) {
  const bool gelu = act == ops::Gate::gelu_tanh;
  OpCase c{.op = gelu ? "geglu" : "swiglu",
           .what = fmt::format("{} {}", gelu ? "geglu" : "swiglu", dims(s)),
           .covers = {"swiglu_forward", "swiglu_backward"},
           .dtypes = kAll,
           .inputs = {{s, -range, range, Grad::returned}, {s, -1, 1, Grad::returned}},
           .ref_tol = 1e-14};
  c.forward = [=](const Tensors& in, bool) {
    return OpRun{{ops::swiglu_forward(in[0], in[1], act)}, {}};
  };
  c.backward = [=](const BackwardArgs& a) {
    auto [dg, du] = ops::swiglu_backward(a.dout, a.in[0], a.in[1], act);
    return Tensors{dg, du};
  };
  c.reference = [=](const Tensors& in) {
    auto G = f64(in[0]), U = f64(in[1]);
    for (size_t i = 0; i < G.size(); ++i) G[i] = (gelu ? gelu_tanh(G[i]) : silu(G[i])) * U[i];
    return Tensors{from(G, s)};
  };
  c.forward_cost = [](const Tensors& in, const OpRun&) {
    return cost::swiglu_forward(in[0], in[1]);
  };
  c.backward_cost = [](const BackwardArgs& a) {
    return cost::swiglu_backward(a.dout, a.in[0], a.in[1]);
  };
  return c;
}

// ---------------------------------------------------------------- rope and attention

// A packed qkv [B, T, (H + 2 KV) hd]: KV 0 is H (multi-head).
struct Qkv {
  int64_t B, T, H, KV, hd;
  Shape shape() const { return {B, T, (H + 2 * KV) * hd}; }
  std::string str() const {
    return fmt::format("[{}, {}, {}] h{}{}", B, T, (H + 2 * KV) * hd, H,
                       KV == H ? "" : fmt::format(" kv{}", KV));
  }
};
Qkv qkv_of(int64_t B, int64_t T, int64_t H, int64_t hd, int64_t KV = 0) {
  return {B, T, H, KV ? KV : H, hd};
}

// Packed rows: doc_start [B, T] of documents of the given lengths, taken in turn (the next row
// goes on with the next length), the last one of each row cut at T.
std::vector<int32_t> packed_rows(int64_t B, int64_t T, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> ds(size_t(B * T));
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0, start = 0, left = 0; t < T; ++t, --left) {
      if (left == 0) {
        start = t;
        left = lengths[next++ % lengths.size()];
      }
      ds[size_t(b * T + t)] = int32_t(start);
    }
  return ds;
}
// The case's doc_start on `device`; undefined for none.
Tensor doc_start_on(const std::vector<int32_t>& ds, const Qkv& q, Device device) {
  if (ds.empty()) return Tensor();
  return Tensor::from_vector(ds, {q.B, q.T}).to(device);
}
std::string packed_str(const std::vector<int32_t>& ds, int64_t T) {
  if (ds.empty()) return "";
  int64_t docs = 0;
  for (size_t i = 0; i < ds.size(); ++i) docs += ds[i] == int32_t(int64_t(i) % T);
  return fmt::format(" packed ({} documents)", docs);
}

// Pair i's frequency theta^(-2i / hd), or Llama 3's: transformers' _compute_llama3_parameters
// written out (low frequencies divided by the factor, high ones kept, a linear blend in 1 /
// wavelength between).
double rope_frequency_reference(const ops::Rope& r, int64_t i, int64_t hd) {
  const double f = std::pow(r.theta, -2.0 * double(i) / double(hd));
  const ops::RopeScaling& s = r.scaling;
  if (!s.enabled()) return f;
  const double wavelength = 2.0 * std::numbers::pi / f;
  if (wavelength < s.original_context / s.high_freq_factor) return f;
  if (wavelength > s.original_context / s.low_freq_factor) return f / s.factor;
  const double smooth = (s.original_context / wavelength - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * f / s.factor + smooth * f;
}

// The q and k heads rotate by position * frequency in pairs (i, i + hd/2); v does not.
// Packed (ds): position t - ds[b, t].
Tensor rope_reference(const Tensor& qkv, const Qkv& q, const ops::Rope& rope, int64_t offset,
                      const std::vector<int32_t>& ds) {
  auto X = f64(qkv);
  const int64_t w = (q.H + 2 * q.KV) * q.hd;
  for (int64_t bt = 0; bt < q.B * q.T; ++bt) {
    const double pos = ds.empty() ? double(bt % q.T + offset) : double(bt % q.T - ds[size_t(bt)]);
    for (int64_t h = 0; h < q.H + q.KV; ++h)  // q heads, then k heads
      for (int64_t i = 0; i < q.hd / 2; ++i) {
        const double ang = pos * rope_frequency_reference(rope, i, q.hd);
        double& e0 = X[size_t(bt * w + h * q.hd + i)];
        double& e1 = X[size_t(bt * w + h * q.hd + i + q.hd / 2)];
        const double c = std::cos(ang), s = std::sin(ang), a = e0, b = e1;
        e0 = a * c - b * s;
        e1 = b * c + a * s;
      }
  }
  return from(X, qkv.shape());
}

OpCase rope_case(const Qkv& q, ops::Rope rope, int64_t offset, std::vector<int32_t> ds = {}) {
  const ops::RopeScaling& s = rope.scaling;
  OpCase c{.op = "rope",
           .what = fmt::format(
               "rope {} theta {:g}{} offset {}{}", q.str(), rope.theta,
               s.enabled() ? fmt::format(" llama3 x{:g} ({:g}/{:g} of {:g})", s.factor,
                                         s.low_freq_factor, s.high_freq_factor, s.original_context)
                           : "",
               offset, packed_str(ds, q.T)),
           .covers = {"rope_"},
           .dtypes = kAll,
           .inputs = {{q.shape(), -1, 1, Grad::returned}},
           .ref_tol = 1e-14};
  c.forward = [=](const Tensors& in, bool in_place) {
    Tensor y = in_place ? in[0] : in[0].clone();
    ops::rope_(y, q.H, rope, false, offset, q.KV, doc_start_on(ds, q, y.device()));
    return OpRun{{y}, {}};
  };
  c.backward = [=](const BackwardArgs& a) {  // the transpose rotation
    Tensor d = a.dout.clone();
    ops::rope_(d, q.H, rope, true, offset, q.KV, doc_start_on(ds, q, d.device()));
    return Tensors{d};
  };
  c.reference = [=](const Tensors& in) {
    return Tensors{rope_reference(in[0], q, rope, offset, ds)};
  };
  c.forward_cost = [](const Tensors& in, const OpRun&) { return cost::rope_(in[0]); };
  c.backward_cost = [](const BackwardArgs& a) { return cost::rope_(a.dout); };
  return c;
}

// softmax(q k^T / sqrt(hd)) v, each query head over its group's kv head, written out directly.
// Packed (ds, causal): query i of row b sees keys ds[b, i] .. i; a window W, none before
// i - W + 1.
Tensor attention_reference(const Tensor& qkv, const Qkv& q, bool causal,
                           const std::vector<int32_t>& ds, int64_t window) {
  auto P = f64(qkv);
  const int64_t w = (q.H + 2 * q.KV) * q.hd, T = q.T, hd = q.hd;
  std::vector<double> O(size_t(q.B * T * q.H * hd), 0.0), s(static_cast<size_t>(T));
  for (int64_t b = 0; b < q.B; ++b)
    for (int64_t h = 0; h < q.H; ++h) {
      const int64_t kh = q.H + h / (q.H / q.KV), vh = kh + q.KV;
      for (int64_t i = 0; i < T; ++i) {
        const int64_t last = causal ? i : T - 1;
        const int64_t first = std::max(ds.empty() ? int64_t(0) : int64_t(ds[size_t(b * T + i)]),
                                       window > 0 ? i - window + 1 : int64_t(0));
        double m = -INFINITY;
        for (int64_t j = first; j <= last; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < hd; ++e)
            acc += P[size_t((b * T + i) * w + h * hd + e)] * P[size_t((b * T + j) * w + kh * hd + e)];
          s[size_t(j)] = acc / std::sqrt(double(hd));
          m = std::max(m, s[size_t(j)]);
        }
        double z = 0;
        for (int64_t j = first; j <= last; ++j) z += std::exp(s[size_t(j)] - m);
        for (int64_t j = first; j <= last; ++j) {
          const double pj = std::exp(s[size_t(j)] - m) / z;
          for (int64_t e = 0; e < hd; ++e)
            O[size_t((b * T + i) * q.H * hd + h * hd + e)] +=
                pj * P[size_t((b * T + j) * w + vh * hd + e)];
        }
      }
    }
  return from(O, {q.B, T, q.H * hd});
}

OpCase attention_case(const Qkv& q, bool causal, int64_t fd_probes = 64, double ref_tol = 1e-12,
                      std::vector<int32_t> ds = {}, int64_t window = 0) {
  OpCase c{.op = "attention",
           .what = fmt::format("attention {}{}{}{}", q.str(), causal ? " causal" : "",
                               packed_str(ds, q.T),
                               window > 0 ? fmt::format(" window {}", window) : std::string()),
           .covers = {"attention_forward", "attention_backward"},
           .dtypes = kAll,
           .inputs = {{q.shape(), -1, 1, Grad::returned}},
           .ref_tol = ref_tol,
           .fd_probes = fd_probes};
  c.forward = [=](const Tensors& in, bool) {
    auto a = ops::attention_forward(in[0], q.H, causal, q.KV, doc_start_on(ds, q, in[0].device()),
                                    window);
    return OpRun{{a.out}, {a.lse}};
  };
  c.backward = [=](const BackwardArgs& a) {
    return Tensors{ops::attention_backward(a.dout, a.in[0], a.fwd.out[0], a.fwd.saved[0], q.H,
                                           causal, q.KV, doc_start_on(ds, q, a.in[0].device()),
                                           window)};
  };
  c.reference = [=](const Tensors& in) {
    return Tensors{attention_reference(in[0], q, causal, ds, window)};
  };
  c.forward_cost = [=](const Tensors& in, const OpRun&) {
    return cost::attention_forward(in[0], q.H, q.KV, causal);
  };
  c.backward_cost = [=](const BackwardArgs& a) {
    return cost::attention_backward(a.dout, a.in[0], a.fwd.out[0], q.H, q.KV, causal);
  };
  return c;
}

// n queries at positions past .. past + n - 1 over a cache of past + n keys and values; a window
// > 0 keeps query past + i to keys from past + i - window + 1.
OpCase decode_case(int64_t n, int64_t past, int64_t H, int64_t KV, int64_t hd, int64_t window = 0) {
  OpCase c{.op = "attention_decode",
           .what = fmt::format("attention_decode {} queries h{} kv{} hd {} past {}{}", n, H, KV, hd,
                               past, window > 0 ? fmt::format(" window {}", window) : ""),
           .covers = {"attention_decode"},
           .dtypes = kAll,
           .inputs = {{{n, H * hd}}, {{past + n, KV * hd}}, {{past + n, KV * hd}}}};
  c.forward = [=](const Tensors& in, bool) {
    return OpRun{{ops::attention_decode(in[0], in[1], in[2], H, past, window)}, {}};
  };
  c.reference = [=](const Tensors& in) {
    auto Q = f64(in[0]), K = f64(in[1]), V = f64(in[2]);
    std::vector<double> O(size_t(n * H * hd), 0.0), s(static_cast<size_t>(past + n));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kh = h / (H / KV), last = past + i;
        const int64_t first = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
        double m = -INFINITY, z = 0;
        for (int64_t j = first; j <= last; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < hd; ++e)
            acc += Q[size_t(i * H * hd + h * hd + e)] * K[size_t(j * KV * hd + kh * hd + e)];
          s[size_t(j)] = acc / std::sqrt(double(hd));
          m = std::max(m, s[size_t(j)]);
        }
        for (int64_t j = first; j <= last; ++j) z += std::exp(s[size_t(j)] - m);
        for (int64_t j = first; j <= last; ++j)
          for (int64_t e = 0; e < hd; ++e)
            O[size_t(i * H * hd + h * hd + e)] +=
                std::exp(s[size_t(j)] - m) / z * V[size_t(j * KV * hd + kh * hd + e)];
      }
    return Tensors{from(O, {n, H * hd})};
  };
  c.forward_cost = [](const Tensors& in, const OpRun&) {
    return cost::attention_decode(in[0], in[1], in[2]);
  };
  return c;
}

// ---------------------------------------------------------------- elementwise

OpCase add_case(const Shape& s, bool in_place_op) {
  OpCase c{.op = in_place_op ? "add_" : "add",
           .what = fmt::format("{} {}", in_place_op ? "add_" : "add", dims(s)),
           .covers = {in_place_op ? "add_" : "add"},
           .dtypes = kAll,
           .inputs = {{s}, {s}},
           .ref_tol = 0};
  c.forward = [=](const Tensors& in, bool in_place) {
    if (!in_place_op) return OpRun{{ops::add(in[0], in[1])}, {}};
    Tensor a = in_place ? in[0] : in[0].clone();
    ops::add_(a, in[1]);
    return OpRun{{a}, {}};
  };
  c.reference = [=](const Tensors& in) {
    auto A = f64(in[0]), B = f64(in[1]);
    for (size_t i = 0; i < A.size(); ++i) A[i] += B[i];
    return Tensors{from(A, s)};
  };
  c.forward_cost = [](const Tensors& in, const OpRun&) { return cost::add(in[0], in[1]); };
  return c;
}

// acc starts at 0.5: sum_squares_into adds.
OpCase sum_squares_case(const Shape& s) {
  OpCase c{.op = "sum_squares",
           .what = fmt::format("sum_squares_into {}", dims(s)),
           .covers = {"sum_squares_into"},
           .dtypes = kAll,
           .inputs = {{s}}};
  c.forward = [](const Tensors& in, bool) {
    Tensor acc = Tensor::full({1}, 0.5, DType::f64, in[0].device());
    ops::sum_squares_into(in[0], acc);
    return OpRun{{acc}, {}};
  };
  c.reference = [](const Tensors& in) {
    double ss = 0.5;
    for (double v : f64(in[0])) ss += v * v;
    return Tensors{from({ss}, {1})};
  };
  c.forward_cost = [](const Tensors& in, const OpRun&) { return cost::sum_squares_into(in[0]); };
  return c;
}

OpCase scale_case(const Shape& s, double factor) {
  OpCase c{.op = "scale_",
           .what = fmt::format("scale_ {} by {:g}", dims(s), factor),
           .covers = {"scale_"},
           .dtypes = kAll,
           .inputs = {{s}},
           .ref_tol = 1e-15};
  c.forward = [=](const Tensors& in, bool in_place) {
    Tensor x = in_place ? in[0] : in[0].clone();
    ops::scale_(x, factor);
    return OpRun{{x}, {}};
  };
  c.reference = [=](const Tensors& in) {
    auto X = f64(in[0]);
    for (double& v : X) v *= factor;
    return Tensors{from(X, s)};
  };
  c.forward_cost = [](const Tensors& in, const OpRun&) { return cost::scale_(in[0]); };
  return c;
}

// A squared norm of 16 (norm 4) clipped to max_norm: scaled by max_norm / (4 + 1e-6) when that
// is below 1, left alone otherwise.
OpCase clip_case(const Shape& s, double max_norm) {
  OpCase c{.op = "clip_scale_",
           .what = fmt::format("clip_scale_ {} norm 4 to {:g}", dims(s), max_norm),
           .covers = {"clip_scale_"},
           .dtypes = kAll,
           .inputs = {{s}},
           .ref_tol = 1e-15};
  c.forward = [=](const Tensors& in, bool in_place) {
    Tensor x = in_place ? in[0] : in[0].clone();
    ops::clip_scale_(x, Tensor::full({1}, 16.0, DType::f64, x.device()), max_norm);
    return OpRun{{x}, {}};
  };
  c.reference = [=](const Tensors& in) {
    auto X = f64(in[0]);
    const double k = std::min(1.0, max_norm / (4.0 + 1e-6));
    for (double& v : X) v *= k;
    return Tensors{from(X, s)};
  };
  c.forward_cost = [](const Tensors& in, const OpRun&) { return cost::scale_(in[0]); };
  return c;
}

// ---------------------------------------------------------------- loss

// out[0] is the mean loss as one f64 where the logits live (read_loss off: no host read). Masked:
// every third row's target is kIgnoreIndex and the sum is divided by 7 rather than the rows (a
// trainer's count of targets across ranks and microbatches).
OpCase cross_entropy_case(int64_t rows, int64_t vocab, double range, bool in_place_backward,
                          bool masked = false) {
  const double divisor = masked ? 7.0 : 0.0;
  // The targets as the case uses them: every third row ignored when masked.
  auto targets = [masked](const Tensor& t) {
    if (!masked) return t;
    Tensor m = t.to(Device::cpu()).to(DType::i64).contiguous().clone();
    for (int64_t r = 1; r < m.numel(); r += 3) m.data<int64_t>()[r] = kIgnoreIndex;
    return m.to(t.dtype()).to(t.device());
  };
  OpCase c{.op = "cross_entropy",
           .what = fmt::format("cross_entropy {}x{}{}{}", rows, vocab,
                               in_place_backward ? " (backward in place)" : "",
                               masked ? " (masked, divisor 7)" : ""),
           .covers = {"cross_entropy_forward", in_place_backward ? "cross_entropy_backward_"
                                                                 : "cross_entropy_backward"},
           .dtypes = kAll,
           .inputs = {{{rows, vocab}, -range, range, Grad::returned},
                      {{rows}, 0, 0, Grad::none, vocab}},
           .ref_tol = 1e-13};
  c.forward = [=](const Tensors& in, bool) {
    auto x = ops::cross_entropy_forward(in[0], targets(in[1]), false, divisor);
    return OpRun{{x.loss_tensor}, {x.lse}};
  };
  c.backward = [=](const BackwardArgs& a) {
    if (!in_place_backward)
      return Tensors{ops::cross_entropy_backward(a.in[0], targets(a.in[1]), a.fwd.saved[0],
                                                 a.dout_scalar, divisor)};
    return Tensors{ops::cross_entropy_backward_(a.in[0].clone(), targets(a.in[1]), a.fwd.saved[0],
                                                a.dout_scalar, divisor)};
  };
  c.reference = [=](const Tensors& in) {
    auto L = f64(in[0]), Y = f64(targets(in[1]));
    double loss = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (int64_t(Y[size_t(r)]) == kIgnoreIndex) continue;
      double z = 0;
      for (int64_t j = 0; j < vocab; ++j) z += std::exp(L[size_t(r * vocab + j)]);
      loss += std::log(z) - L[size_t(r * vocab + int64_t(Y[size_t(r)]))];
    }
    return Tensors{from({loss / (masked ? divisor : double(rows))}, {1})};
  };
  c.forward_cost = [](const Tensors& in, const OpRun&) {
    return cost::cross_entropy_forward(in[0], in[1]);
  };
  c.backward_cost = [](const BackwardArgs& a) {
    return cost::cross_entropy_backward(a.in[0], a.in[1]);
  };
  return c;
}

// ---------------------------------------------------------------- FSDP's copies and AdamW

// `segments` from a src of n elements into a dst of n that starts at 0.5 (untouched elements
// stay so); cast: dst is bf16 (the f32 master weights copied out to bf16 parameters). In place
// (the benchmark's repeated calls) the dst is made once and kept, so that a timed call is the
// copy alone.
OpCase copy_segments_case(int64_t n, std::vector<ops::Segment> segments, bool cast) {
  OpCase c{.op = "copy_segments",
           .what = fmt::format("copy_segments {} segments of {}{}", segments.size(), n,
                               cast ? " to bf16" : ""),
           .covers = {"copy_segments"},
           .dtypes = kAll,
           .inputs = {{{n}}},
           .ref_tol = cast ? 1e-2 : 0};
  auto kept = std::make_shared<Tensor>();
  c.forward = [=](const Tensors& in, bool in_place) {
    const DType dt = cast ? DType::bf16 : in[0].dtype();
    Tensor dst = in_place ? *kept : Tensor();
    if (!dst.defined() || dst.dtype() != dt || dst.device() != in[0].device())
      dst = Tensor::full({n}, 0.5, dt, in[0].device());
    if (in_place) *kept = dst;
    ops::copy_segments(dst, in[0], segments);
    return OpRun{{dst}, {}};
  };
  c.reference = [=](const Tensors& in) {
    auto S = f64(in[0]);
    std::vector<double> D(size_t(n), 0.5);
    for (const ops::Segment& g : segments)
      for (int64_t i = 0; i < g.count; ++i) D[size_t(g.dst_offset + i)] = S[size_t(g.src_offset + i)];
    return Tensors{from(D, {n})};
  };
  c.forward_cost = [](const Tensors& in, const OpRun& r) {
    return cost::copy_segments(r.out[0], in[0]);
  };
  return c;
}

// ---------------------------------------------------------------- mixture of experts

// The MoE combine of n tokens with k choices each over rows [n k, d] in a fixed shuffled order
// (pos a permutation, as nn::MoE's stable sort by expert makes it), weighted, onto a base:
// inputs rows, weight (cast to f64 for the op) and base, each with its gradient.
OpCase moe_combine_case(int64_t n, int64_t k, int64_t d) {
  OpCase c{.op = "moe_combine",
           .what = fmt::format("moe_combine {} tokens x {} of {}", n, k, d),
           .covers = {"moe_combine", "moe_combine_backward"},
           .dtypes = kAll,
           .inputs = {{{n * k, d}, -1, 1, Grad::returned},
                      {{n * k}, 0, 1, Grad::returned},
                      {{n, d}, -1, 1, Grad::returned}},
           .ref_tol = 1e-15};
  std::vector<int64_t> perm(static_cast<size_t>(n * k));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int64_t(i);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[(i * 7919 + 13) % i]);
  auto pos_on = [perm, n, k](Device dev) {
    return Tensor::from_vector<int64_t>(perm, {n * k}).to(dev);
  };
  c.forward = [=](const Tensors& in, bool) {
    return OpRun{{ops::moe_combine(in[0], pos_on(in[0].device()), in[1].to(DType::f64), in[2], k)},
                 {}};
  };
  c.backward = [=](const BackwardArgs& a) {
    auto g = ops::moe_combine_backward(a.dout, a.in[0], pos_on(a.in[0].device()),
                                       a.in[1].to(DType::f64), k);
    return Tensors{g.drows, g.dweight.to(a.in[1].dtype()), a.dout};
  };
  c.reference = [=](const Tensors& in) {
    auto R = f64(in[0]), W = f64(in[1]), out = f64(in[2]);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k; ++j)
        for (int64_t col = 0; col < d; ++col)
          out[size_t(t * d + col)] +=
              W[size_t(t * k + j)] * R[size_t(perm[size_t(t * k + j)] * d + col)];
    return Tensors{from(out, {n, d})};
  };
  c.forward_cost = [=](const Tensors& in, const OpRun&) {
    return cost::moe_combine(in[0], pos_on(Device::cpu()), in[1].to(DType::f64), in[2], k);
  };
  c.backward_cost = [=](const BackwardArgs& a) {
    return cost::moe_combine_backward(a.dout, a.in[0], pos_on(Device::cpu()),
                                      a.in[1].to(DType::f64));
  };
  return c;
}

// `steps` AdamW steps (torch.optim.AdamW's single-tensor formula) from state m, v with the
// gradients g_1 .. g_steps; out: p, m, v.
OpCase adamw_case(int64_t n, int64_t steps, ops::AdamWHyper h, double tol_f32 = 1e-5) {
  OpCase c{.op = "adamw",
           .what = fmt::format("adamw {} x {} steps wd {:g}", n, steps, h.weight_decay),
           .covers = {"adamw_multi_"},  // adamw_ is adamw_multi_ of one tensor
           .dtypes = kFull,
           .inputs = {{{n}}, {{n}, -0.1, 0.1}, {{n}, 0, 0.01}},
           .tol_f32 = tol_f32};
  for (int64_t s = 0; s < steps; ++s) c.inputs.push_back({{n}});
  c.forward = [=](const Tensors& in, bool in_place) {
    Tensor p = in[0], m = in[1], v = in[2];
    if (!in_place) p = p.clone(), m = m.clone(), v = v.clone();
    for (int64_t s = 1; s <= steps; ++s) ops::adamw_(p, in[size_t(2 + s)], m, v, h, s);
    return OpRun{{p, m, v}, {}};
  };
  c.reference = [=](const Tensors& in) {
    auto P = f64(in[0]), M = f64(in[1]), V = f64(in[2]);
    for (int64_t s = 1; s <= steps; ++s) {
      auto G = f64(in[size_t(2 + s)]);
      for (size_t i = 0; i < P.size(); ++i) {
        P[i] *= 1 - h.lr * h.weight_decay;
        M[i] = h.beta1 * M[i] + (1 - h.beta1) * G[i];
        V[i] = h.beta2 * V[i] + (1 - h.beta2) * G[i] * G[i];
        const double mhat = M[i] / (1 - std::pow(h.beta1, double(s)));
        const double vhat = V[i] / (1 - std::pow(h.beta2, double(s)));
        P[i] -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
      }
    }
    return Tensors{from(P, {n}), from(M, {n}), from(V, {n})};
  };
  c.forward_cost = [=](const Tensors& in, const OpRun&) {
    Cost total;
    for (int64_t s = 1; s <= steps; ++s)
      total = total + cost::adamw_(in[0], in[size_t(2 + s)], in[1], in[2]);
    return total;
  };
  return c;
}

// `steps` multi-tensor AdamW steps over tensors of sizes n0 and n1 (weight decay 0.1 and 0) in one
// call, the gradients clipped as they are read by a global norm of 4 (total_sq 16) to max_norm.
OpCase adamw_multi_case(int64_t n0, int64_t n1, int64_t steps, double max_norm) {
  const ops::AdamWHyper h{.lr = 1e-2};
  const double wd[2] = {0.1, 0.0};
  const int64_t n[2] = {n0, n1};
  OpCase c{.op = "adamw",
           .what = fmt::format("adamw_multi_ {} + {} x {} steps, norm 4 clipped to {:g}", n0, n1,
                               steps, max_norm),
           .covers = {"adamw_multi_"},
           .dtypes = kFull,
           .inputs = {},
           .tol_f32 = 1e-5};
  for (int k = 0; k < 2; ++k)  // p, m, v of each tensor
    for (OpInput in : {OpInput{{n[k]}}, OpInput{{n[k]}, -0.1, 0.1}, OpInput{{n[k]}, 0, 0.01}})
      c.inputs.push_back(in);
  for (int64_t s = 0; s < steps; ++s)
    for (int k = 0; k < 2; ++k) c.inputs.push_back({{n[k]}});  // the gradients
  c.forward = [=](const Tensors& in, bool in_place) {
    Tensors st(in.begin(), in.begin() + 6);
    if (!in_place)
      for (Tensor& t : st) t = t.clone();
    const Tensor total = Tensor::full({1}, 16.0, DType::f64, st[0].device());
    for (int64_t s = 1; s <= steps; ++s) {
      std::vector<ops::AdamWTensors> ts;
      for (int k = 0; k < 2; ++k)
        ts.push_back({st[size_t(3 * k)], in[size_t(6 + 2 * (s - 1) + k)], st[size_t(3 * k + 1)],
                      st[size_t(3 * k + 2)], wd[k]});
      ops::adamw_multi_(ts, h, s, {.total_sq = total, .max_norm = max_norm});
    }
    return OpRun{st, {}};
  };
  c.reference = [=](const Tensors& in) {
    const double clip = std::min(1.0, max_norm / (4.0 + 1e-6));
    Tensors out;
    for (int k = 0; k < 2; ++k) {
      auto P = f64(in[size_t(3 * k)]), M = f64(in[size_t(3 * k + 1)]), V = f64(in[size_t(3 * k + 2)]);
      for (int64_t s = 1; s <= steps; ++s) {
        auto G = f64(in[size_t(6 + 2 * (s - 1) + k)]);
        for (size_t i = 0; i < P.size(); ++i) {
          const double g = G[i] * clip;
          P[i] *= 1 - h.lr * wd[k];
          M[i] = h.beta1 * M[i] + (1 - h.beta1) * g;
          V[i] = h.beta2 * V[i] + (1 - h.beta2) * g * g;
          const double mhat = M[i] / (1 - std::pow(h.beta1, double(s)));
          const double vhat = V[i] / (1 - std::pow(h.beta2, double(s)));
          P[i] -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
        }
      }
      for (auto* t : {&P, &M, &V}) out.push_back(from(*t, {n[k]}));
    }
    return out;
  };
  c.forward_cost = [=](const Tensors& in, const OpRun&) {
    Cost total;
    for (int64_t s = 1; s <= steps; ++s)
      for (int k = 0; k < 2; ++k)
        total = total + cost::adamw_(in[size_t(3 * k)], in[size_t(6 + 2 * (s - 1) + k)],
                                     in[size_t(3 * k + 1)], in[size_t(3 * k + 2)]);
    return total;
  };
  return c;
}

uint64_t seed_of(const std::string& s) {  // FNV-1a: stable across runs and compilers
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

}  // namespace

std::vector<OpCase> op_cases() {
  std::vector<OpCase> v;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) v.push_back(gemm_case(5, 7, 3, ta, tb));
  v.push_back(linear_case({2, 3, 5}, 4, true));
  v.push_back(linear_case({4, 33, 40}, 24, true));
  v.push_back(linear_case({8, 64}, 32, false));
  v.push_back(embedding_case({2, 6}, 5, 4));  // repeated ids exercise the scatter-add
  v.push_back(embedding_case({3, 17}, 50, 24));
  // Few rows (a CUDA block each), and more rows than the backward's blocks with more columns
  // than a block's threads.
  v.push_back(rmsnorm_case(3, 8));
  v.push_back(rmsnorm_case(37, 96));
  v.push_back(rmsnorm_case(37, 96, 64, 1.0));
  v.push_back(rmsnorm_case(1500, 1000, 8));
  v.push_back(silu_case({4, 6}, 3));
  v.push_back(silu_case({1000}, 4));
  v.push_back(swiglu_case({4, 6}, 3));
  v.push_back(swiglu_case({1000}, 4));
  v.push_back(swiglu_case({4, 6}, 3, ops::Gate::gelu_tanh));
  v.push_back(swiglu_case({1000}, 5, ops::Gate::gelu_tanh));
  // One token of one choice; more columns than a CUDA block's threads, and k 8.
  v.push_back(moe_combine_case(1, 1, 4));
  v.push_back(moe_combine_case(7, 2, 300));
  v.push_back(moe_combine_case(5, 8, 24));
  v.push_back(rope_case(qkv_of(1, 3, 2, 4), 10000.0, 0));
  v.push_back(rope_case(qkv_of(2, 5, 4, 6, 2), 100000.0, 3));
  v.push_back(rope_case(qkv_of(1, 5, 2, 64), 10000.0, 295));  // generation at an offset
  for (int64_t hd : {16, 64, 128}) v.push_back(rope_case(qkv_of(2, 45, 2, hd), 10000.0, 0));
  for (int64_t kv : {2, 1}) v.push_back(rope_case(qkv_of(2, 37, 4, 32, kv), 10000.0, 0));
  // Llama 3's scaling: Llama 3.1's factors, and an original context of 64 so that the low, blended
  // and kept frequencies all occur at head dim 64 (theta 5e5), at an offset and packed.
  const ops::RopeScaling llama31{.factor = 8.0}, short_context{32.0, 1.0, 4.0, 64.0};
  v.push_back(rope_case(qkv_of(2, 45, 2, 128, 1), {500000.0, llama31}, 0));
  v.push_back(rope_case(qkv_of(2, 45, 4, 64, 2), {500000.0, short_context}, 7));
  v.push_back(rope_case(qkv_of(2, 45, 4, 64, 2), {500000.0, short_context}, 0,
                        packed_rows(2, 45, {1, 20, 3, 30})));
  for (bool causal : {false, true}) {
    // T 300 is longer than one tile of 128 query rows (the CPU kernel's scratch is 128 x T):
    // the tiles' seams, the causal key limit per tile and dK/dV across tiles.
    v.push_back(attention_case(qkv_of(2, 5, 2, 4), causal, 120, 1e-13));
    v.push_back(attention_case(qkv_of(1, 300, 2, 4), causal, 60));
    for (int64_t hd : {16, 64, 128}) v.push_back(attention_case(qkv_of(2, 45, 2, hd), causal, 32));
    // Grouped-query: 4 query heads over 2 and over 1 kv heads (the dk/dv pass sums a group);
    // T 130 crosses the CPU kernel's 128-row tile.
    for (int64_t kv : {2, 1}) {
      v.push_back(attention_case(qkv_of(2, 5, 4, 6, kv), causal, 120, 1e-13));
      v.push_back(attention_case(qkv_of(2, 130, 4, 6, kv), causal, 40));
      v.push_back(attention_case(qkv_of(2, 37, 4, 32, kv), causal, 32));
    }
  }
  v.push_back(attention_case(qkv_of(2, 16, 4, 8), true, 32));
  // Packed rows: documents of 1 to 150 positions, some across the CPU kernel's 128-row tile and
  // the CUDA kernels' 8-query blocks and 16-key tiles; positions restart in each.
  v.push_back(rope_case(qkv_of(2, 45, 4, 16, 2), 10000.0, 0, packed_rows(2, 45, {1, 20, 3, 30})));
  v.push_back(attention_case(qkv_of(2, 5, 2, 4), true, 120, 1e-13, packed_rows(2, 5, {2, 3})));
  v.push_back(
      attention_case(qkv_of(2, 45, 4, 16, 2), true, 40, 1e-12, packed_rows(2, 45, {1, 20, 3, 30})));
  v.push_back(attention_case(qkv_of(1, 300, 2, 8), true, 60, 1e-12,
                             packed_rows(1, 300, {100, 7, 150, 43})));
  v.push_back(
      attention_case(qkv_of(2, 130, 4, 6, 1), true, 40, 1e-12, packed_rows(2, 130, {17, 64, 9})));
  // Sliding windows: 1 (each query alone), shorter than a tile and than the CUDA blocks, across
  // the CPU's 128-row tiles (130 of 300), as long as the row (no window in effect), and with
  // packed rows (the nearer of the document's start and the window's).
  for (int64_t w : {1, 4, 44})  // 44: only the last query of 45 loses key 0
    v.push_back(attention_case(qkv_of(2, 45, 4, 16, 2), true, 40, 1e-12, {}, w));
  v.push_back(attention_case(qkv_of(1, 300, 2, 8), true, 60, 1e-12, {}, 130));
  v.push_back(attention_case(qkv_of(1, 300, 2, 8), true, 60, 1e-12, {}, 20));  // tiles of 32
  v.push_back(attention_case(qkv_of(2, 130, 4, 6, 1), true, 40, 1e-12,
                             packed_rows(2, 130, {17, 64, 9}), 20));
  v.push_back(decode_case(3, 37, 4, 1, 32, 5));  // a window shorter than the cache
  v.push_back(decode_case(3, 297, 2, 2, 8, 200));  // more keys than the CUDA block's threads
  v.push_back(decode_case(3, 4, 2, 2, 4));
  v.push_back(decode_case(3, 4, 4, 2, 6));
  v.push_back(decode_case(3, 37, 4, 1, 32));
  v.push_back(decode_case(5, 295, 2, 2, 64));  // over a 300-position cache
  v.push_back(add_case({3, 4}, false));
  v.push_back(add_case({999}, false));
  v.push_back(add_case({3, 4}, true));
  v.push_back(add_case({999}, true));
  v.push_back(sum_squares_case({3, 4}));
  v.push_back(sum_squares_case({5000}));
  v.push_back(scale_case({999}, 0.37));
  v.push_back(clip_case({999}, 2.0));   // clipped
  v.push_back(clip_case({999}, 10.0));  // under the limit: unchanged
  for (bool in_place : {false, true}) {
    v.push_back(cross_entropy_case(6, 7, 2, in_place));
    v.push_back(cross_entropy_case(70, 300, 3, in_place));
    v.push_back(cross_entropy_case(9, 11, 2, in_place, /*masked=*/true));
  }
  for (bool cast : {false, true}) v.push_back(copy_segments_case(100, {{0, 10, 20}, {30, 70, 30}}, cast));
  v.push_back(adamw_case(10, 3, {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                 .weight_decay = 0.1}));
  v.push_back(adamw_case(5000, 3, {.lr = 1e-2}, 1e-6));
  v.push_back(adamw_multi_case(10, 5000, 3, 1.0));   // clipped
  v.push_back(adamw_multi_case(7, 40000, 2, 10.0));  // under the limit
  return v;
}

std::vector<OpCase> perf_cases(const ModelShape& m) {
  const int64_t N = m.batch * m.seq, D = m.dim, hd = m.dim / m.heads;
  std::vector<OpCase> v;
  auto add = [&](OpCase c, std::vector<DType> dtypes = {DType::bf16}) {
    c.dtypes = std::move(dtypes);
    v.push_back(std::move(c));
  };
  for (bool causal : {false, true}) add(attention_case(qkv_of(m.batch, m.seq, m.heads, hd), causal));
  add(rope_case(qkv_of(m.batch, m.seq, m.heads, hd), 10000.0, 0));
  add(linear_case({N, D}, 4 * D, false));  // the FFN's up projection; dW in f32
  add(rmsnorm_case(N, D));
  add(swiglu_case({N, 4 * D}, 4));
  add(add_case({N, D}, true));  // the residual
  add(embedding_case({m.batch, m.seq}, m.vocab, D));
  add(cross_entropy_case(N, m.vocab, 3, false));
  const int64_t P = m.shard;  // the flat shard's f32 master weights
  add(adamw_case(P, 1, {.lr = 1e-4}), {DType::f32});
  std::vector<ops::Segment> segs;
  for (int64_t i = 0; i < 16; ++i) segs.push_back({i * (P / 16), i * (P / 16), P / 16});
  add(copy_segments_case(P, segs, true), {DType::f32});
  return v;
}

std::vector<Tensor> make_inputs(const OpCase& c, DType dtype, DType ids_dtype) {
  std::vector<Tensor> in;
  const uint64_t seed = seed_of(c.what);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const OpInput& s = c.inputs[i];
    if (s.vocab > 0) {
      Tensor t = Tensor::empty(s.shape, DType::i64);
      for (int64_t j = 0; j < t.numel(); ++j)
        t.data<int64_t>()[j] =
            int64_t(nn::counter_uniform(seed + i, uint64_t(j)) * double(s.vocab));
      in.push_back(t.to(ids_dtype));
    } else {
      Tensor t = Tensor::empty(s.shape, DType::f64);
      nn::init_fill(nn::Init::uniform(s.lo, s.hi), seed + i, "op_case", 0, t);
      in.push_back(t.to(dtype));
    }
  }
  return in;
}

Tensor make_dout(const OpCase& c, const Tensor& out0, DType through) {
  Tensor t = Tensor::empty(out0.shape(), DType::f64);
  nn::init_fill(nn::Init::uniform(-1, 1), seed_of(c.what) + 1000, "op_case_dout", 0, t);
  return t.to(through).to(out0.dtype()).to(out0.device());
}

std::vector<Tensor> make_acc(const OpCase& c, const std::vector<Tensor>& in, double value) {
  std::vector<Tensor> acc;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (c.inputs[i].grad == Grad::accumulated)
      acc.push_back(Tensor::full(in[i].shape(),
                                 value, in[i].dtype() == DType::f64 ? DType::f64 : DType::f32,
                                 in[i].device()));
  return acc;
}

CaseResult run_case(const OpCase& c, const std::vector<Tensor>& in, double acc_init,
                    DType dout_through) {
  CaseResult r{c.forward(in, false), Tensor(), std::vector<Tensor>(in.size())};
  if (!c.backward) return r;
  r.dout = make_dout(c, r.fwd.out[0], dout_through);
  const double d0 = r.dout.numel() == 1 ? r.dout.to(Device::cpu()).item() : 0.0;
  std::vector<Tensor> acc = make_acc(c, in, acc_init);
  std::vector<Tensor> returned = c.backward({in, r.fwd, r.dout, d0, acc});
  size_t ia = 0, ir = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (c.inputs[i].grad == Grad::accumulated) r.grads[i] = acc[ia++];
    if (c.inputs[i].grad == Grad::returned) r.grads[i] = returned.at(ir++);
  }
  return r;
}

}  // namespace fsdp::test
