// Forward and backward of the Transformer's building blocks, on top of fsdp::ops.
#include "fsdp/nn/layers.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/ops/ops.h"

namespace fsdp::nn {

// ---------------------------------------------------------------- LoRA

namespace {
constexpr std::pair<const char*, LoraTarget> kLoraTargets[] = {
    {"q", LoraTarget::q},      {"k", LoraTarget::k},       {"v", LoraTarget::v},
    {"o", LoraTarget::o},      {"gate", LoraTarget::gate}, {"up", LoraTarget::up},
    {"down", LoraTarget::down}};
}  // namespace

uint32_t parse_lora_targets(const std::string& list) {
  uint32_t bits = 0;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, comma - at);
    bool known = false;
    for (const auto& [n, bit] : kLoraTargets)
      if (name == n) {
        bits |= bit;
        known = true;
      }
    FSDP_CHECK(known,
               "[LoRA] unknown target '{}' in '{}'; expected a comma-separated list of q, "
               "k, v, o, gate, up, down",
               name, list);
    at = comma + 1;
  }
  return bits;
}

std::string lora_target_names(uint32_t targets) {
  std::string out;
  for (const auto& [n, bit] : kLoraTargets)
    if (targets & bit) out += (out.empty() ? "" : ",") + std::string(n);
  return out;
}

LoraAdapter::LoraAdapter(Parameter& a, Parameter& b, int64_t out,
                         std::vector<std::pair<int64_t, int64_t>> parts, double scale)
    : a_(&a), b_(&b), out_(out), rank_(b.shape.at(1)), scale_(scale) {
  const auto p = int64_t(parts.size());
  FSDP_CHECK(p > 0 && a.shape.at(0) == p * rank_,
             "[LoRA] lora_A has {} rows for {} parts of rank {}", a.shape.at(0), p, rank_);
  whole_ = p == 1 && parts[0] == std::pair<int64_t, int64_t>{0, out};
  int64_t b_row = 0;
  for (int64_t j = 0; j < p; ++j) {
    const auto [begin, end] = parts[size_t(j)];
    for (int64_t r = begin; r < end; ++r, ++b_row)
      b_rows_.push_back({r * p * rank_ + j * rank_, b_row * rank_, rank_});
  }
  FSDP_CHECK(b_row == b.shape.at(0), "[LoRA] lora_B has {} rows but its parts cover {}",
             b.shape.at(0), b_row);
}

Tensor LoraAdapter::full_b(const Tensor& b) const {
  if (whole_) return b;
  const int64_t width = a_->shape[0];
  Tensor full = Tensor::zeros({out_ * width}, b.dtype(), b.device());
  ops::copy_segments(full, b.view({-1}), b_rows_);
  return full.view({out_, width});
}

static thread_local int lora_disabled_depth = 0;  // LoraDisabledScopes alive on this thread
LoraDisabledScope::LoraDisabledScope() { ++lora_disabled_depth; }
LoraDisabledScope::~LoraDisabledScope() { --lora_disabled_depth; }
bool lora_disabled() { return lora_disabled_depth > 0; }

Tensor LoraAdapter::forward(const Tensor& x, const Tensor& y) {
  if (lora_disabled()) return Tensor();  // the base alone: y as the frozen projection wrote it
  // xa = scale x A^T, then y += xa full_b^T: the scale is applied once, on the narrow side.
  Tensor xa = ops::linear_forward(x, a_->data, Tensor());
  ops::scale_(xa, scale_);
  const int64_t rows = xa.numel() / a_->shape[0];
  ops::gemm(xa.view({rows, a_->shape[0]}), false, full_b(b_->data), true, y.view({rows, out_}), 1.0,
            1.0);
  return xa;
}

void LoraAdapter::backward(const Tensor& dy, const Tensor& x, Tensor xa, const Tensor& dx) {
  FSDP_CHECK(xa.defined(), "[LoRA] a backward after a forward with the adapters switched off "
                           "(LoraDisabledScope): that forward saved nothing for one");
  // dB += dy^T xa (the scale is in xa) and dxa = dy full_b; then dA += scale dxa^T x and
  // dx += scale dxa A.
  Tensor dxa;
  if (whole_) {
    dxa = ops::linear_backward(dy, xa, b_->data, b_->grad, Tensor());
  } else {
    Tensor dfull;
    if (b_->grad.defined())
      dfull = Tensor::zeros({out_, a_->shape[0]}, b_->grad.dtype(), b_->grad.device());
    dxa = ops::linear_backward(dy, xa, full_b(b_->data), dfull, Tensor());
    if (dfull.defined()) {  // B's rows back out of the block-diagonal form
      std::vector<ops::Segment> back;
      back.reserve(b_rows_.size());
      for (const ops::Segment& s : b_rows_) back.push_back({s.src_offset, s.dst_offset, s.count});
      Tensor db = Tensor::empty({b_->grad.numel()}, b_->grad.dtype(), b_->grad.device());
      ops::copy_segments(db, dfull.view({-1}), back);
      ops::add_(b_->grad, db.view(b_->grad.shape()));
    }
  }
  xa = Tensor();
  ops::scale_(dxa, scale_);
  ops::add_(dx, ops::linear_backward(dxa, x, a_->data, a_->grad, Tensor()));
}

namespace {
// Registers lora_A and lora_B on `owner`'s behalf (through `reg`) and returns their adapter.
template <class Reg>
LoraAdapter make_lora(Reg&& reg, int64_t in, int64_t out,
                      std::vector<std::pair<int64_t, int64_t>> parts, const LoraConfig& lora) {
  FSDP_CHECK(lora.rank > 0 && lora.alpha > 0 && std::isfinite(lora.alpha),
             "[LoRA] rank {} and alpha {} must be positive", lora.rank, lora.alpha);
  int64_t rows = 0;
  for (const auto& [b, e] : parts) rows += e - b;
  const double bound = 1.0 / std::sqrt(double(in));
  Parameter& a =
      reg("lora_A", Shape{int64_t(parts.size()) * lora.rank, in}, Init::uniform(-bound, bound));
  Parameter& b = reg("lora_B", Shape{rows, lora.rank}, Init::constant(0.0));
  return LoraAdapter(a, b, out, std::move(parts), lora.scale());
}
}  // namespace

// ---------------------------------------------------------------- Linear

Linear::Linear(int64_t in, int64_t out, bool bias, LoraConfig lora) : Module("Linear") {
  FSDP_CHECK(in > 0 && out > 0, "[Linear] sizes must be positive, got in {} out {}", in, out);
  const double bound = 1.0 / std::sqrt(double(in));
  weight_ = &register_parameter("weight", {out, in}, Init::uniform(-bound, bound));
  if (bias) bias_ = &register_parameter("bias", {out}, Init::uniform(-bound, bound));
  if (lora.rank > 0)
    lora_.emplace(make_lora(
        [&](std::string n, Shape s, Init i) -> Parameter& {
          return register_parameter(std::move(n), std::move(s), i);
        },
        in, out, {{0, out}}, lora));
}

Tensor Linear::forward_impl(const Tensor& x) {
  Tensor y = ops::linear_forward(x, weight_->data, bias_ ? bias_->data : Tensor());
  save_for_backward(Saved{x, lora_ ? lora_->forward(x, y) : Tensor()});
  return y;
}

Tensor Linear::backward_impl(const Tensor& dy) {
  auto s = take_saved<Saved>();
  Tensor dx =
      ops::linear_backward(dy, s.x, weight_->data, weight_->grad, bias_ ? bias_->grad : Tensor());
  if (lora_) lora_->backward(dy, s.x, std::exchange(s.xa, Tensor()), dx);
  return dx;
}

// ---------------------------------------------------------------- Embedding

Embedding::Embedding(int64_t vocab, int64_t dim) : Module("Embedding") {
  FSDP_CHECK(vocab > 0 && dim > 0, "[Embedding] sizes must be positive, got vocab {} dim {}", vocab,
             dim);
  weight_ = &register_parameter("weight", {vocab, dim}, Init::normal(0.0, 1.0));
}

Tensor Embedding::forward_impl(const Tensor& ids) {
  save_for_backward(Saved{ids});
  return ops::embedding_forward(ids, weight_->data);
}

Tensor Embedding::backward_impl(const Tensor& dy) {
  const auto s = take_saved<Saved>();
  if (weight_->grad.defined()) ops::embedding_backward(dy, s.ids, weight_->grad);
  return Tensor();
}

// ---------------------------------------------------------------- RMSNorm

RMSNorm::RMSNorm(int64_t dim, std::optional<double> eps, bool plus_one)
    : Module("RMSNorm"), eps_(eps), offset_(plus_one ? 1.0 : 0.0) {
  weight_ = &register_parameter("weight", {dim}, Init::constant(plus_one ? 0.0 : 1.0));
}

Tensor RMSNorm::forward_impl(const Tensor& x) {
  auto r = ops::rmsnorm_forward(x, weight_->data,
                                eps_.value_or(ops::default_rmsnorm_eps(x.dtype())), offset_);
  save_for_backward(Saved{x, r.rstd});
  return r.y;
}

Tensor RMSNorm::backward_impl(const Tensor& dy) {
  const auto s = take_saved<Saved>();
  return ops::rmsnorm_backward(dy, s.x, weight_->data, s.rstd, weight_->grad, offset_);
}

// ---------------------------------------------------------------- attention

MultiheadAttention::MultiheadAttention(int64_t dim, int64_t heads, AttentionOptions opt)
    : Module("MultiheadAttention"),
      dim_(dim),
      heads_(heads),
      kv_heads_(opt.kv_heads > 0 ? opt.kv_heads : heads),
      hd_(opt.head_dim > 0 ? opt.head_dim : (heads > 0 ? dim / heads : 0)),
      opt_(opt) {
  FSDP_CHECK(heads > 0 && (opt.head_dim > 0 || dim % heads == 0),
             "[MultiheadAttention] dim {} is not divisible by heads {}", dim, heads);
  FSDP_CHECK(opt.window >= 0 && (opt.window == 0 || opt.causal),
             "[MultiheadAttention] a sliding window ({}) must be >= 0, and needs causal attention",
             opt.window);
  FSDP_CHECK(opt.kv_heads >= 0 && opt.head_dim >= 0,
             "[MultiheadAttention] kv heads {} and head dim {} must be >= 0 (0: the default)",
             opt.kv_heads, opt.head_dim);
  FSDP_CHECK(heads % kv_heads_ == 0,
             "[MultiheadAttention] heads {} is not divisible by kv heads {}", heads, kv_heads_);
  FSDP_CHECK(opt.rope_theta <= 0 || hd_ % 2 == 0,
             "[MultiheadAttention] rotary embedding needs an even head dim, got {}", hd_);
  const int64_t rows = (heads + 2 * kv_heads_) * hd_;
  const double bound =
      opt.xavier_in_proj ? std::sqrt(6.0 / double(dim + rows)) : 1.0 / std::sqrt(double(dim));
  in_proj_weight_ =
      &register_parameter("in_proj_weight", {rows, dim}, Init::uniform(-bound, bound));
  if (opt.bias || opt.qkv_bias)
    in_proj_bias_ = &register_parameter("in_proj_bias", {rows}, Init::constant(0.0));
  out_proj_ = &register_module(
      "out_proj", std::make_unique<Linear>(heads * hd_, dim, opt.bias,
                                           opt.lora.on(LoraTarget::o) ? opt.lora : LoraConfig{}));
  if (opt.bias) out_proj_->bias()->init = Init::constant(0.0);  // nn.MultiheadAttention zeroes it
  FSDP_CHECK(opt.qk_norm || !opt.qk_norm_whole,
             "[MultiheadAttention] qk_norm_whole (a QK-norm over the whole width) needs qk_norm");
  if (opt.qk_norm) {
    const int64_t q_width = opt.qk_norm_whole ? heads * hd_ : hd_;
    const int64_t k_width = opt.qk_norm_whole ? kv_heads_ * hd_ : hd_;
    q_norm_ = &register_module(
        "q_norm", std::make_unique<RMSNorm>(q_width, opt.norm_eps, opt.norm_plus_one));
    k_norm_ = &register_module(
        "k_norm", std::make_unique<RMSNorm>(k_width, opt.norm_eps, opt.norm_plus_one));
  }
  // q, k and v's rows of the packed in-projection, each adapted on its own where targeted.
  std::vector<std::pair<int64_t, int64_t>> parts;
  const int64_t dq = heads * hd_, dkv = kv_heads_ * hd_;
  if (opt.lora.on(LoraTarget::q)) parts.emplace_back(0, dq);
  if (opt.lora.on(LoraTarget::k)) parts.emplace_back(dq, dq + dkv);
  if (opt.lora.on(LoraTarget::v)) parts.emplace_back(dq + dkv, dq + 2 * dkv);
  if (!parts.empty())
    lora_.emplace(make_lora(
        [&](std::string n, Shape s, Init i) -> Parameter& {
          return register_parameter(std::move(n), std::move(s), i);
        },
        dim, rows, std::move(parts), opt.lora));
}

namespace {
// The [n * width] rows of `part` (q: offset 0, width heads*hd; k: offset heads*hd, width
// kv_heads*hd) inside n packed qkv rows of `stride`, as segments of a gather (to_part) or of the
// scatter back.
std::vector<ops::Segment> part_rows(int64_t n, int64_t stride, int64_t offset, int64_t width,
                                    bool to_part) {
  std::vector<ops::Segment> rows;
  rows.reserve(size_t(n));
  for (int64_t r = 0; r < n; ++r)
    rows.push_back(to_part ? ops::Segment{r * width, r * stride + offset, width}
                           : ops::Segment{r * stride + offset, r * width, width});
  return rows;
}
}  // namespace

void MultiheadAttention::qk_norm_forward(const Tensor& qkv) {
  const int64_t dq = heads_ * hd_, dkv = kv_heads_ * hd_, w = dq + 2 * dkv, n = qkv.numel() / w;
  Tensor flat = qkv.view({n * w});
  auto norm_part = [&](RMSNorm& norm, int64_t offset, int64_t width) {
    Tensor part = Tensor::empty({n * width}, qkv.dtype(), qkv.device());
    ops::copy_segments(part, flat, part_rows(n, w, offset, width, true));
    const int64_t unit = opt_.qk_norm_whole ? width : hd_;  // the span one RMS is taken over
    Tensor y = norm.forward(part.view({n * width / unit, unit}));
    ops::copy_segments(flat, y.view({n * width}), part_rows(n, w, offset, width, false));
  };
  norm_part(*q_norm_, 0, dq);
  norm_part(*k_norm_, dq, dkv);
}

void MultiheadAttention::qk_norm_backward(const Tensor& dqkv) {
  const int64_t dq = heads_ * hd_, dkv = kv_heads_ * hd_, w = dq + 2 * dkv, n = dqkv.numel() / w;
  Tensor flat = dqkv.view({n * w});
  auto grad_part = [&](RMSNorm& norm, int64_t offset, int64_t width) {
    Tensor part = Tensor::empty({n * width}, dqkv.dtype(), dqkv.device());
    ops::copy_segments(part, flat, part_rows(n, w, offset, width, true));
    const int64_t unit = opt_.qk_norm_whole ? width : hd_;
    Tensor dx = norm.backward(part.view({n * width / unit, unit}));
    ops::copy_segments(flat, dx.view({n * width}), part_rows(n, w, offset, width, false));
  };
  grad_part(*q_norm_, 0, dq);
  grad_part(*k_norm_, dq, dkv);
}

void MultiheadAttention::start_kv_cache(int64_t capacity) {
  FSDP_CHECK(opt_.causal, "[MultiheadAttention] a KV cache needs causal attention (the decoder form)");
  FSDP_CHECK(capacity > 0, "[MultiheadAttention] KV cache capacity must be positive, got {}",
             capacity);
  if (capacity != kv_cap_) k_cache_ = v_cache_ = Tensor();  // allocated at the next forward
  kv_cap_ = capacity;
  kv_len_ = 0;
}

void MultiheadAttention::stop_kv_cache() {
  k_cache_ = v_cache_ = Tensor();
  kv_len_ = -1;
  kv_cap_ = 0;
}

Tensor MultiheadAttention::forward_cached(const Tensor& x) {
  const int64_t n = x.size(1), dq = heads_ * hd_, dkv = kv_heads_ * hd_, w = dq + 2 * dkv;
  FSDP_CHECK(x.size(0) == 1, "[MultiheadAttention] a KV cache holds one sequence; got batch {}",
             x.size(0));
  FSDP_CHECK(kv_len_ + n <= kv_cap_,
             "[MultiheadAttention] the KV cache holds {} positions: {} cached + {} new do not fit",
             kv_cap_, kv_len_, n);
  Tensor qkv =
      ops::linear_forward(x, in_proj_weight_->data, in_proj_bias_ ? in_proj_bias_->data : Tensor());
  if (lora_) (void)lora_->forward(x, qkv);
  if (opt_.qk_norm) qk_norm_forward(qkv);
  if (opt_.rope_theta > 0)
    ops::rope_(qkv, heads_, {opt_.rope_theta, opt_.rope_scaling}, false, kv_len_, kv_heads_);
  if (!k_cache_.defined()) {  // sized by the kv heads
    k_cache_ = Tensor::empty({kv_cap_ * dkv}, qkv.dtype(), qkv.device());
    v_cache_ = Tensor::empty({kv_cap_ * dkv}, qkv.dtype(), qkv.device());
  }
  // Rows of the packed [n, w] qkv: q into its own buffer, k and v after the cached positions.
  std::vector<ops::Segment> q_rows, k_rows, v_rows;
  for (int64_t r = 0; r < n; ++r) {
    q_rows.push_back({r * dq, r * w, dq});
    k_rows.push_back({(kv_len_ + r) * dkv, r * w + dq, dkv});
    v_rows.push_back({(kv_len_ + r) * dkv, r * w + dq + dkv, dkv});
  }
  Tensor flat = qkv.view({n * w});
  Tensor q = Tensor::empty({n * dq}, qkv.dtype(), qkv.device());
  ops::copy_segments(q, flat, q_rows);
  ops::copy_segments(k_cache_, flat, k_rows);
  ops::copy_segments(v_cache_, flat, v_rows);
  const int64_t keys = kv_len_ + n;
  Tensor out = ops::attention_decode(
      q.view({n, dq}), k_cache_.slice(0, keys * dkv).view({keys, dkv}),
      v_cache_.slice(0, keys * dkv).view({keys, dkv}), heads_, kv_len_, opt_.window);
  kv_len_ = keys;
  return out_proj_->forward(out.view({1, n, dq}));
}

Tensor MultiheadAttention::forward_impl(const Tensor& x) {
  FSDP_CHECK(x.dim() == 3 && x.size(2) == dim_,
             "[MultiheadAttention] input must be [B, T, {}], got {}", dim_, shape_str(x.shape()));
  const Tensor& ds = batch_context().doc_start;
  if (kv_len_ >= 0) {
    FSDP_CHECK(!ds.defined(),
               "[MultiheadAttention] a KV cache holds one document, not packed rows");
    return forward_cached(x);
  }
  FSDP_CHECK(!ds.defined() || opt_.causal,
             "[MultiheadAttention] packed rows need causal attention (the decoder form); this model's "
             "attention is bidirectional");
  Tensor qkv =
      ops::linear_forward(x, in_proj_weight_->data, in_proj_bias_ ? in_proj_bias_->data : Tensor());
  Tensor xa = lora_ ? lora_->forward(x, qkv) : Tensor();
  if (opt_.qk_norm) qk_norm_forward(qkv);
  if (opt_.rope_theta > 0)
    ops::rope_(qkv, heads_, {opt_.rope_theta, opt_.rope_scaling}, false, 0, kv_heads_, ds);
  auto a = ops::attention_forward(qkv, heads_, opt_.causal, kv_heads_, ds, opt_.window);
  save_for_backward(Saved{x, std::move(xa), qkv, a.out, a.lse, ds});
  return out_proj_->forward(a.out);
}

Tensor MultiheadAttention::backward_impl(const Tensor& dy) {
  auto s = take_saved<Saved>();
  Tensor dattn = out_proj_->backward(dy);
  Tensor dqkv = ops::attention_backward(dattn, s.qkv, s.out, s.lse, heads_, opt_.causal, kv_heads_,
                                        s.doc_start, opt_.window);
  if (opt_.rope_theta > 0)
    ops::rope_(dqkv, heads_, {opt_.rope_theta, opt_.rope_scaling}, true, 0, kv_heads_,
               s.doc_start);
  if (opt_.qk_norm) qk_norm_backward(dqkv);
  Tensor dx = ops::linear_backward(dqkv, s.x, in_proj_weight_->data, in_proj_weight_->grad,
                                   in_proj_bias_ ? in_proj_bias_->grad : Tensor());
  if (lora_) lora_->backward(dqkv, s.x, std::exchange(s.xa, Tensor()), dx);
  return dx;
}

// ---------------------------------------------------------------- feed-forward

namespace {
ops::Gate gate_of(FeedForward::Kind k) {
  return k == FeedForward::Kind::geglu ? ops::Gate::gelu_tanh : ops::Gate::silu;
}
}  // namespace

FeedForward::FeedForward(int64_t dim, int64_t hidden, Kind kind, LoraConfig lora)
    : Module("FeedForward"), kind_(kind) {
  auto adapt = [&](LoraTarget t) { return lora.on(t) ? lora : LoraConfig{}; };
  if (kind == Kind::silu_mlp) {
    FSDP_CHECK(!lora.on(LoraTarget::gate),
               "[LoRA] target gate: this FFN (Linear-SiLU-Linear) has no gate projection");
    up_ =
        &register_module("0", std::make_unique<Linear>(dim, hidden, false, adapt(LoraTarget::up)));
    down_ = &register_module("2",
                             std::make_unique<Linear>(hidden, dim, false, adapt(LoraTarget::down)));
  } else {
    gate_ = &register_module("w1",
                             std::make_unique<Linear>(dim, hidden, false, adapt(LoraTarget::gate)));
    down_ = &register_module("w2",
                             std::make_unique<Linear>(hidden, dim, false, adapt(LoraTarget::down)));
    up_ =
        &register_module("w3", std::make_unique<Linear>(dim, hidden, false, adapt(LoraTarget::up)));
  }
}

Tensor FeedForward::forward_impl(const Tensor& x) {
  if (kind_ == Kind::silu_mlp) {
    Tensor h = up_->forward(x);
    save_for_backward(Saved{h, Tensor(), Tensor()});
    return down_->forward(ops::silu_forward(h));
  }
  Tensor g = gate_->forward(x);
  Tensor u = up_->forward(x);
  save_for_backward(Saved{Tensor(), g, u});
  return down_->forward(ops::swiglu_forward(g, u, gate_of(kind_)));
}

Tensor FeedForward::backward_impl(const Tensor& dy) {
  auto s = take_saved<Saved>();
  Tensor dh = down_->backward(dy);
  if (kind_ == Kind::silu_mlp) {
    Tensor dx = up_->backward(ops::silu_backward(dh, s.h));
    return dx;
  }
  auto [dg, du] = ops::swiglu_backward(dh, s.g, s.u, gate_of(kind_));
  s.g = s.u = Tensor();  // freed before the projections' backward
  Tensor dx = gate_->backward(dg);
  ops::add_(dx, up_->backward(du));
  return dx;
}

// ---------------------------------------------------------------- block

TransformerBlock::TransformerBlock(int64_t dim, int64_t heads, int64_t ffn_hidden,
                                   FeedForward::Kind ffn_kind, AttentionOptions attn,
                                   NormOptions norms, std::unique_ptr<Module> ffn)
    : Module("TransformerBlock") {
  auto norm = [&] { return std::make_unique<RMSNorm>(dim, norms.eps, norms.plus_one); };
  norm1_ = &register_module("norm1", norm());
  attn_ = &register_module("attn", std::make_unique<MultiheadAttention>(dim, heads, attn));
  if (norms.sandwich) post_attn_norm_ = &register_module("post_attn_norm", norm());
  norm2_ = &register_module("norm2", norm());
  if (ffn)
    ffn_ = &register_module("ffn", std::move(ffn));
  else
    ffn_ = &register_module("ffn",
                            std::make_unique<FeedForward>(dim, ffn_hidden, ffn_kind, attn.lora));
  if (norms.sandwich) post_ffn_norm_ = &register_module("post_ffn_norm", norm());
}

Tensor TransformerBlock::forward_impl(const Tensor& x) {
  Tensor a = attn_->forward(norm1_->forward(x));
  if (post_attn_norm_) a = post_attn_norm_->forward(a);
  Tensor h = ops::add(x, a);
  Tensor f = ffn_->forward(norm2_->forward(h));
  if (post_ffn_norm_) f = post_ffn_norm_->forward(f);
  return ops::add(h, f);
}

Tensor TransformerBlock::backward_impl(const Tensor& dy) {
  // dy flows straight through both residuals; each branch adds its part. (The sandwich norms'
  // gradients are temporaries: freed once their branch's backward returns.)
  Tensor dh = norm2_->backward(ffn_->backward(post_ffn_norm_ ? post_ffn_norm_->backward(dy) : dy));
  ops::add_(dh, dy);
  Tensor dx =
      norm1_->backward(attn_->backward(post_attn_norm_ ? post_attn_norm_->backward(dh) : dh));
  ops::add_(dx, dh);
  return dx;
}

}  // namespace fsdp::nn
