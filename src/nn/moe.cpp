// nn::MoE: routing, permutation, the experts' grouped GEMMs, the combine and their backward; the
// router's auxiliary loss. fsdp/nn/moe.h holds the design; this file the arithmetic.
//
// The routing and the router's backward are host loops in f64 over the logits read back; the
// weights and each token's sum over its k choices (ops::moe_combine) are exact to f64, then rounded
// once to the activations' dtype. The permutation is ops::copy_segments (one row per segment) and
// the experts' work is ops::gemm over row views, so those run where the tensors live.
#include "fsdp/nn/moe.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "fsdp/nn/init.h"
#include "fsdp/ops/ops.h"

namespace fsdp::nn {
namespace {

// v [rows, cols] as a tensor of `dtype` on `device`.
Tensor rows_tensor(const std::vector<double>& v, int64_t rows, int64_t cols, DType dtype,
                   Device device) {
  return Tensor::from_vector<double>(v, {rows, cols}).to(dtype).to(device);
}

// dst row i = src row from[i], for flat [rows, dim] buffers: one segment per row.
void gather_rows(const Tensor& dst, const Tensor& src, const std::vector<int64_t>& from,
                 int64_t dim) {
  std::vector<ops::Segment> segs(from.size());
  for (size_t i = 0; i < from.size(); ++i)
    segs[i] = {int64_t(i) * dim, from[i] * dim, dim};
  if (!segs.empty()) ops::copy_segments(dst.flatten(), src.flatten(), segs);
}

// A host vector as a tensor on `device` (the meta device: its allocation only).
template <class T>
Tensor on_device(const std::vector<T>& v, Device device) {
  if (device.is_meta()) return Tensor::empty({int64_t(v.size())}, dtype_of<T>(), device);
  return Tensor::from_vector<T>(v, {int64_t(v.size())}).to(device);
}

// p = softmax(l) over E values; returns logsumexp(l).
double softmax_row(const double* l, double* p, int64_t E) {
  const double m = *std::max_element(l, l + E);
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - m));
  for (int64_t e = 0; e < E; ++e) p[e] /= sum;
  return m + std::log(sum);
}

// grad += op(a) op(b): into grad directly when it holds the activations' dtype, else through a
// temporary of theirs (FSDP keeps gradients in its reduce dtype: f32 under bf16 parameters).
void add_gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& grad) {
  if (grad.dtype() == a.dtype()) {
    ops::gemm(a, ta, b, tb, grad, 1.0, 1.0);
    return;
  }
  Tensor part = Tensor::empty(grad.shape(), a.dtype(), a.device());
  ops::gemm(a, ta, b, tb, part);
  ops::add_(grad, part);
}

// The k largest of v[0..n), larger first, ties to the lower index (torch.topk on the CPU).
void top_k(const double* v, int64_t n, int64_t k, int32_t* out) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  std::copy(idx.begin(), idx.begin() + k, out);
}

}  // namespace

// ---------------------------------------------------------------- experts

Experts::Experts(int64_t dim, int64_t experts, int64_t hidden) : Module("Experts"), experts_(experts) {
  // Each expert is initialised as nn.Linear's weight of its own shape.
  const double a = 1.0 / std::sqrt(double(dim)), b = 1.0 / std::sqrt(double(hidden));
  gate_proj_ = &register_parameter("gate_proj", {experts, hidden, dim}, Init::uniform(-a, a));
  up_proj_ = &register_parameter("up_proj", {experts, hidden, dim}, Init::uniform(-a, a));
  down_proj_ = &register_parameter("down_proj", {experts, dim, hidden}, Init::uniform(-b, b));
}

void Experts::set_local_experts(int64_t local) {
  FSDP_CHECK(!gate_proj_->data.defined(),
             "[MoE] {}: the experts split over expert parallel after the parameters materialized; "
             "set it before",
             describe());
  FSDP_CHECK(local >= 1, "[MoE] {}: {} local experts; expected at least 1", describe(), local);
  experts_ = local;
  for (Parameter* p : {gate_proj_, up_proj_, down_proj_}) p->shape[0] = local;
}

Tensor Experts::forward_impl(const Tensor&) {
  FSDP_FAIL("[MoE] {} is run by its MoE (grouped_forward), not on its own", describe());
}
Tensor Experts::backward_impl(const Tensor&) {
  FSDP_FAIL("[MoE] {} is run by its MoE (grouped_backward), not on its own", describe());
}

Tensor Experts::grouped_forward(const Tensor& xp, const std::vector<int64_t>& offsets) {
  FSDP_CHECK(int64_t(offsets.size()) == experts_ + 1 && offsets.back() == xp.size(0),
             "[MoE] {}: {} offsets for {} experts over {} rows", describe(), offsets.size(),
             experts_, xp.size(0));
  const int64_t R = xp.size(0), H = gate_proj_->shape[1], dim = gate_proj_->shape[2];
  Tensor g = Tensor::empty({R, H}, xp.dtype(), xp.device());
  Tensor u = Tensor::empty({R, H}, xp.dtype(), xp.device());
  for (int64_t e = 0; e < experts_; ++e) {
    const int64_t b = offsets[size_t(e)], n = offsets[size_t(e) + 1] - b;
    if (n == 0) continue;
    ops::gemm(xp.slice(b, b + n), false, gate_proj_->data.select(e), true, g.slice(b, b + n));
    ops::gemm(xp.slice(b, b + n), false, up_proj_->data.select(e), true, u.slice(b, b + n));
  }
  Tensor y = Tensor::empty({R, dim}, xp.dtype(), xp.device());
  {
    Tensor a = ops::swiglu_forward(g, u);
    for (int64_t e = 0; e < experts_; ++e) {
      const int64_t b = offsets[size_t(e)], n = offsets[size_t(e) + 1] - b;
      if (n > 0)
        ops::gemm(a.slice(b, b + n), false, down_proj_->data.select(e), true, y.slice(b, b + n));
    }
  }
  save_for_backward(Saved{xp, g, u, offsets});
  return y;
}

Tensor Experts::grouped_backward(const Tensor& dyp) {
  auto s = take_saved<Saved>();
  const int64_t R = s.xp.size(0), H = gate_proj_->shape[1], dim = gate_proj_->shape[2];
  FSDP_CHECK(dyp.dim() == 2 && dyp.size(0) == R && dyp.size(1) == dim,
             "[MoE] {}: gradient {} for rows [{}, {}]", describe(), shape_str(dyp.shape()), R, dim);
  auto rows = [&](int64_t e) {
    return std::pair<int64_t, int64_t>{s.offsets[size_t(e)], s.offsets[size_t(e) + 1]};
  };
  Tensor da = Tensor::empty({R, H}, dyp.dtype(), dyp.device());
  {
    Tensor a = ops::swiglu_forward(s.g, s.u);  // recomputed: cheaper to keep g and u only
    for (int64_t e = 0; e < experts_; ++e) {
      const auto [b, end] = rows(e);
      if (b == end) continue;
      ops::gemm(dyp.slice(b, end), false, down_proj_->data.select(e), false, da.slice(b, end));
      if (down_proj_->grad.defined())
        add_gemm(dyp.slice(b, end), true, a.slice(b, end), false, down_proj_->grad.select(e));
    }
  }
  auto [dg, du] = ops::swiglu_backward(da, s.g, s.u);
  da = s.g = s.u = Tensor();
  Tensor dxp = Tensor::empty({R, dim}, dyp.dtype(), dyp.device());
  for (int64_t e = 0; e < experts_; ++e) {
    const auto [b, end] = rows(e);
    if (b == end) continue;
    ops::gemm(dg.slice(b, end), false, gate_proj_->data.select(e), false, dxp.slice(b, end));
    ops::gemm(du.slice(b, end), false, up_proj_->data.select(e), false, dxp.slice(b, end), 1.0,
              1.0);
    if (gate_proj_->grad.defined())
      add_gemm(dg.slice(b, end), true, s.xp.slice(b, end), false, gate_proj_->grad.select(e));
    if (up_proj_->grad.defined())
      add_gemm(du.slice(b, end), true, s.xp.slice(b, end), false, up_proj_->grad.select(e));
  }
  return dxp;
}

// ---------------------------------------------------------------- MoE

MoE::MoE(int64_t dim, MoEOptions opt) : Module("MoE"), dim_(dim), opt_(opt) {
  FSDP_CHECK(dim > 0 && opt.experts > 0 && opt.hidden > 0,
             "[MoE] dim {}, experts {} and hidden {} must be positive", dim, opt.experts,
             opt.hidden);
  FSDP_CHECK(opt.top_k >= 1 && opt.top_k <= opt.experts,
             "[MoE] top_k {} must be in [1, experts {}]", opt.top_k, opt.experts);
  FSDP_CHECK(opt.experts <= std::numeric_limits<int32_t>::max(), "[MoE] {} experts: too many",
             opt.experts);
  FSDP_CHECK(opt.router == RouterKind::softmax_topk || !opt.norm_topk_prob,
             "[MoE] norm_topk_prob renormalizes router softmax_topk's weights (softmax then top "
             "k); router topk_softmax's (top k then softmax) are normalized already");
  gate_ = &register_module("gate", std::make_unique<Linear>(dim, opt.experts, false));
  experts_ = &register_module("experts", std::make_unique<Experts>(dim, opt.experts, opt.hidden));
}

void MoE::set_expert_parallel(ExpertParallel ep) {
  const int n = ep.size;
  FSDP_CHECK(n >= 1 && ep.rank >= 0 && ep.rank < n && (n == 1 || ep.exchange),
             "[MoE] {}: expert parallel rank {} of {} ranks{}", describe(), ep.rank, n,
             n > 1 && !ep.exchange ? " without an exchange" : "");
  FSDP_CHECK(opt_.experts % n == 0,
             "[MoE] {}: {} experts do not split evenly over an expert-parallel group of {} ranks",
             describe(), opt_.experts, n);
  experts_->set_local_experts(opt_.experts / n);
  ep_ = n > 1 ? std::move(ep) : ExpertParallel{};
}

int64_t MoE::first_local_expert() const { return int64_t(ep_.rank) * (opt_.experts / ep_.size); }

Tensor MoE::run_experts(Tensor xp, const std::vector<int64_t>& offsets,
                        std::shared_ptr<const ExpertExchange>& dispatch) {
  if (ep_.size == 1) return experts_->grouped_forward(xp, offsets);
  FSDP_CHECK(!xp.device().is_cuda(),
             "[MoE] {}: expert parallel on CUDA is not supported yet (its count exchange runs on "
             "host tensors, which an NCCL group refuses); run without expert parallel",
             describe());
  std::vector<int64_t> counts(size_t(opt_.experts));
  for (size_t e = 0; e < counts.size(); ++e) counts[e] = offsets[e + 1] - offsets[e];
  dispatch = ep_.exchange(std::move(counts));
  Tensor received = dispatch->dispatch(xp);
  xp = Tensor();
  std::vector<int64_t> local(1, 0);
  for (int64_t c : dispatch->local_counts()) local.push_back(local.back() + c);
  return dispatch->combine(experts_->grouped_forward(received, local));
}

void MoE::set_router_grad(RouterGrad grad) {
  FSDP_CHECK(grad.dprob.empty() || int64_t(grad.dprob.size()) == opt_.experts,
             "[MoE] {}: a router gradient of {} experts, the layer has {}", describe(),
             grad.dprob.size(), opt_.experts);
  grads_[batch_context().microbatch] = std::move(grad);
}

MoE::Routing MoE::route(const Tensor& logits, RouterCall& call) const {
  const int64_t N = logits.size(0), E = opt_.experts, k = opt_.top_k;
  Routing r;
  r.expert.resize(size_t(N * k));
  r.weight.assign(size_t(N * k), 0.0);
  r.pos.resize(size_t(N * k));
  r.offsets.assign(size_t(E + 1), 0);
  call.rows = N;
  call.pairs.assign(size_t(E), 0.0);
  call.prob_sum.assign(size_t(E), 0.0);
  if (logits.device().is_meta()) {  // no values: choices 0..k-1, the CPU's allocations
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < k; ++j) r.expert[size_t(t * k + j)] = int32_t(j);
  } else {
    const std::vector<double> all = logits.to_f64_vector();
    std::vector<double> p(static_cast<size_t>(E));
    for (int64_t t = 0; t < N; ++t) {
      const double* l = &all[size_t(t * E)];
      const double lse = softmax_row(l, p.data(), E);
      for (int64_t e = 0; e < E; ++e) call.prob_sum[size_t(e)] += p[size_t(e)];
      call.z_sum += lse * lse;
      int32_t* chosen = &r.expert[size_t(t * k)];
      double* w = &r.weight[size_t(t * k)];
      top_k(opt_.router == RouterKind::softmax_topk ? p.data() : l, E, k, chosen);
      double norm = 0;
      for (int64_t j = 0; j < k; ++j) norm += (w[j] = p[size_t(chosen[j])]);
      // Mixtral's softmax over the k logits is the k probabilities over their sum.
      if (opt_.norm_topk_prob || opt_.router == RouterKind::topk_softmax)
        for (int64_t j = 0; j < k; ++j) w[j] /= norm;
    }
  }
  // A stable counting sort of the (token, choice) pairs by expert.
  for (int32_t e : r.expert) ++r.offsets[size_t(e) + 1];
  for (int64_t e = 0; e < E; ++e) {
    call.pairs[size_t(e)] = double(r.offsets[size_t(e) + 1]);
    r.offsets[size_t(e) + 1] += r.offsets[size_t(e)];
  }
  std::vector<int64_t> next(r.offsets.begin(), r.offsets.end() - 1);
  for (size_t i = 0; i < r.expert.size(); ++i) r.pos[i] = next[size_t(r.expert[i])]++;
  r.logits = logits;
  return r;
}

Tensor MoE::forward_impl(const Tensor& x) {
  FSDP_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) == dim_, "[MoE] {}: input {} has no last dim {}",
             describe(), shape_str(x.shape()), dim_);
  const Tensor x2 = x.reshape({-1, dim_});
  const int64_t N = x2.size(0), k = opt_.top_k;
  auto call = std::make_shared<RouterCall>();
  Routing r = route(gate_->forward(x2), *call);
  // permute: xp[pos[t k + j]] = x[t]
  Tensor xp = Tensor::empty({N * k, dim_}, x.dtype(), x.device());
  {
    std::vector<int64_t> from(size_t(N * k));
    for (size_t i = 0; i < from.size(); ++i) from[size_t(r.pos[i])] = int64_t(i) / k;
    gather_rows(xp, x2, from, dim_);
  }
  std::shared_ptr<const ExpertExchange> dispatch;
  Tensor yp = run_experts(std::move(xp), r.offsets, dispatch);
  // combine: each token's k choices in order, in f64
  Tensor pos = on_device(r.pos, x.device()), weight = on_device(r.weight, x.device());
  Tensor out = ops::moe_combine(yp, pos, weight, Tensor(), k);
  last_ = call;
  save_for_backward(Saved{std::move(r), std::move(pos), std::move(weight), std::move(yp),
                          x.shape(), std::move(dispatch)});
  return out.view(x.shape());
}

std::vector<double> MoE::router_backward(const Routing& r, const std::vector<double>& dw) const {
  const int64_t E = opt_.experts, k = opt_.top_k, N = int64_t(dw.size()) / k;
  const auto it = grads_.find(batch_context().microbatch);
  const RouterGrad* aux = it == grads_.end() ? nullptr : &it->second;
  const std::vector<double> logits = r.logits.to_f64_vector();
  std::vector<double> dl(static_cast<size_t>(N * E), 0.0), dp(static_cast<size_t>(E)),
      prob(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    const double* p = prob.data();
    const double lse = softmax_row(&logits[size_t(t * E)], prob.data(), E);
    const int32_t* chosen = &r.expert[size_t(t * k)];
    const double* w = &r.weight[size_t(t * k)];
    const double* g = &dw[size_t(t * k)];
    double* d = &dl[size_t(t * E)];
    const bool normalized = opt_.norm_topk_prob || opt_.router == RouterKind::topk_softmax;
    double gw = 0;  // sum_j dw_j w_j: the normalization's share
    for (int64_t j = 0; j < k; ++j) gw += g[j] * w[j];
    if (aux && !aux->dprob.empty())
      std::copy(aux->dprob.begin(), aux->dprob.end(), dp.begin());
    else
      std::fill(dp.begin(), dp.end(), 0.0);
    if (opt_.router == RouterKind::softmax_topk) {
      // w_j = s_j (/ S), s_j = p[chosen_j]: d s_j = dw_j, or (dw_j - sum_i dw_i w_i) / S
      double S = 0;
      for (int64_t j = 0; j < k; ++j) S += p[chosen[j]];
      for (int64_t j = 0; j < k; ++j) dp[size_t(chosen[j])] += normalized ? (g[j] - gw) / S : g[j];
    } else {  // Mixtral: softmax over the k logits
      for (int64_t j = 0; j < k; ++j) d[chosen[j]] += w[j] * (g[j] - gw);
    }
    double pdp = 0;  // through p = softmax(logits)
    for (int64_t e = 0; e < E; ++e) pdp += p[e] * dp[size_t(e)];
    for (int64_t e = 0; e < E; ++e) d[e] += p[e] * (dp[size_t(e)] - pdp);
    if (aux && aux->dz != 0)  // d lse^2 = 2 lse p
      for (int64_t e = 0; e < E; ++e) d[e] += aux->dz * 2.0 * lse * p[e];
  }
  return dl;
}

Tensor MoE::backward_impl(const Tensor& dy) {
  auto s = take_saved<Saved>();
  const int64_t k = opt_.top_k, N = int64_t(s.routing.expert.size()) / k;
  const Tensor dy2 = dy.reshape({-1, dim_});
  FSDP_CHECK(dy2.size(0) == N, "[MoE] {}: gradient {} for input {}", describe(),
             shape_str(dy.shape()), shape_str(s.shape));
  const bool meta = dy.device().is_meta();
  // d yp[pos] = w dy[t]; d w = <dy[t], yp[pos]>
  ops::MoECombineGrad g = ops::moe_combine_backward(dy2.contiguous(), s.yp, s.pos, s.weight, k);
  s.yp = Tensor();
  // Through expert parallel's exchanges: the combine's backward sends the gradients to the
  // experts' ranks, the dispatch's brings the inputs' gradients back.
  Tensor dxp = s.dispatch ? s.dispatch->combine(
                                experts_->grouped_backward(s.dispatch->dispatch(g.drows)))
                          : experts_->grouped_backward(g.drows);
  g.drows = Tensor();
  Tensor dlogits;
  if (meta)
    dlogits = Tensor::empty({N, opt_.experts}, dy.dtype(), dy.device());
  else
    dlogits = rows_tensor(router_backward(s.routing, g.dweight.to_f64_vector()), N, opt_.experts,
                          dy.dtype(), dy.device());
  // unpermute: each token's k rows summed in order, onto the router's dx
  Tensor dx = ops::moe_combine(dxp, s.pos, Tensor(), gate_->backward(dlogits).contiguous(), k);
  return dx.view(s.shape);
}

}  // namespace fsdp::nn
