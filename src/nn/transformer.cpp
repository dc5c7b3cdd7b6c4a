// nn::Transformer, the generic decoder: its assembly from a family's blocks, the KV cache, the forward
// and backward with the fused loss.
#include "fsdp/nn/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "fsdp/core/meta.h"
#include "fsdp/ops/ops.h"
#include "src/nn/transformer_moe.h"

namespace fsdp::nn {

std::unique_ptr<Module> default_block(const TransformerConfig& cfg, int64_t i) {
  AttentionOptions a;
  FeedForward::Kind ffn_kind = FeedForward::Kind::silu_mlp;
  if (cfg.arch == Arch::decoder) {
    a = {.bias = false,
         .causal = true,
         .rope_theta = cfg.rope_theta,
         .rope_scaling = cfg.rope_scaling,
         .xavier_in_proj = false,
         .kv_heads = cfg.kv_heads,
         .head_dim = cfg.head_dim,
         .qkv_bias = cfg.qkv_bias,
         .qk_norm = cfg.qk_norm,
         .norm_eps = cfg.norm_eps,
         .norm_plus_one = cfg.norm_plus_one};
    ffn_kind = cfg.geglu ? FeedForward::Kind::geglu : FeedForward::Kind::swiglu;
    if (!cfg.layer_global(i)) {  // local: windowed, its own base
      a.window = cfg.sliding_window;
      if (cfg.rope_local_theta > 0) a.rope_theta = cfg.rope_local_theta;
      a.rope_scaling = {};
    }
  }
  a.lora = cfg.lora;
  const NormOptions norms{
      .eps = cfg.norm_eps, .plus_one = cfg.norm_plus_one, .sandwich = cfg.sandwich_norms};
  std::unique_ptr<MoE> moe;
  if (cfg.moe.sparse(i)) moe = std::make_unique<MoE>(cfg.dim, cfg.moe.options());
  return std::make_unique<TransformerBlock>(cfg.dim, cfg.heads, cfg.resolved_ffn_hidden(),
                                            ffn_kind, a, norms, std::move(moe));
}

Transformer::Transformer(const TransformerConfig& cfg) : Transformer(cfg, family_blocks(cfg)) {}

Transformer::Transformer(const TransformerConfig& cfg, const BlockFactory& blocks)
    : Module("Transformer"), cfg_(cfg) {
  cfg.validate();
  FSDP_CHECK(blocks, "[model] no block factory");
  embed_ = &register_module("embed", std::make_unique<Embedding>(cfg.vocab, cfg.dim));
  layers_ = &register_module("layers", std::make_unique<ModuleList>());
  for (int64_t i = 0; i < cfg.layers; ++i) {
    std::unique_ptr<Module> block = blocks(cfg, i);
    FSDP_CHECK(block, "[model] the block factory made no block {}", i);
    layers_->append(std::move(block));
  }
  layers_->for_each_module([&](Module& m) {  // pre-order: layer order
    if (auto* moe = dynamic_cast<MoE*>(&m)) moe_.push_back(moe);
    if (auto* attn = dynamic_cast<MultiheadAttention*>(&m)) attention_.push_back(attn);
  });
  if (cfg.arch == Arch::decoder)
    norm_ = &register_module("norm",
                             std::make_unique<RMSNorm>(cfg.dim, cfg.norm_eps, cfg.norm_plus_one));
  if (!cfg.tie_embeddings)
    head_ = &register_module("head", std::make_unique<Linear>(cfg.dim, cfg.vocab, false));
  else  // the head's use sets the scale: N(0, 1/dim) starts the logits near unit variance
    embed_->weight().init = Init::normal(0.0, 1.0 / std::sqrt(double(cfg.dim)));
  if (cfg.lora.enabled())  // only the adapters train
    for (auto& [name, p] : named_parameters()) p->requires_grad = is_lora_parameter(name);
}

bool is_lora_parameter(const std::string& name) {
  return name.ends_with("lora_A") || name.ends_with("lora_B");
}

double Transformer::embed_scale(DType dtype) const {
  // sqrt(dim) rounded to the activations' dtype, as transformers' embed_scale.to(weight.dtype)
  return Tensor::full({1}, std::sqrt(double(cfg_.dim)), dtype).to(DType::f64).to_f64_vector()[0];
}

void Transformer::start_kv_cache(int64_t capacity) {
  FSDP_CHECK(cfg_.arch == Arch::decoder,
             "[model] a KV cache needs causal attention: arch {}, not {}", arch_name(Arch::decoder),
             arch_name(cfg_.arch));
  for (MultiheadAttention* a : attention_) a->start_kv_cache(capacity);
}

void Transformer::stop_kv_cache() {
  for (MultiheadAttention* a : attention_) a->stop_kv_cache();
}

int64_t Transformer::kv_length() { return attention_.empty() ? -1 : attention_[0]->kv_length(); }

Tensor Transformer::forward_impl(const Tensor& tokens) {
  FSDP_CHECK(tokens.dim() == 2, "[model] tokens must be [batch, seq], got {}",
             shape_str(tokens.shape()));
  Tensor e = embed_->forward(tokens);
  if (cfg_.embed_scale) ops::scale_(e, embed_scale(e.dtype()));
  Tensor x = layers_->forward(e);
  if (norm_) x = norm_->forward(x);
  const meta::TermScope logits(meta::Term::logits);  // the head's output and the loss
  if (const BatchContext& ctx = batch_context(); ctx.targets.defined()) {
    Parameter& w = head_ ? head_->weight() : embed_->weight();
    Saved s;
    Tensor loss = s.loss.forward(x, w.data, ctx.targets, ctx.loss_divisor, ctx.loss_chunk_logits);
    if (ctx.no_backward) s.loss.clear();
    save_for_backward(std::move(s));
    return moe_.empty() ? loss : with_router_loss(loss);
  }
  for (MoE* m : moe_) m->set_router_grad({});  // the logits' loss carries no router loss
  if (head_) {
    save_for_backward(Saved{});
    return head_->forward(x);
  }
  save_for_backward(Saved{ChunkedLMLoss(), x});  // tied: logits = x embed^T
  return ops::linear_forward(x, embed_->weight().data, Tensor());
}

Tensor Transformer::backward_impl(const Tensor& dlogits) {
  Tensor dx;
  std::optional<meta::TermScope> logits(meta::Term::logits);  // the head's and the loss's backward
  {
    auto s = take_saved<Saved>();  // freed before the blocks' backward
    FSDP_CHECK(s.loss.pending() || moe_.empty() || (cfg_.moe.aux_coef == 0 && cfg_.moe.z_coef == 0),
               "[model] the router's loss (moe.aux_coef {}, moe.z_coef {}) is added by the fused "
               "loss only (--fused-loss); a backward of the logits would leave it out",
               cfg_.moe.aux_coef, cfg_.moe.z_coef);
    if (s.loss.pending()) {  // the fused loss: its dx, and the head's gradient added chunk by chunk
      FSDP_CHECK(!dlogits.defined(),
                 "[model] backward after a fused loss takes no gradient (the context's "
                 "loss_scale is d(loss)); got {}",
                 shape_str(dlogits.shape()));
      Parameter& w = head_ ? head_->weight() : embed_->weight();
      dx = s.loss.backward(batch_context().loss_scale, w.grad);
    } else if (head_) {
      dx = head_->backward(dlogits);
    } else {  // adds dlogits^T x into the embedding's gradient; its backward adds the scatter
      Parameter& w = embed_->weight();
      dx = ops::linear_backward(dlogits, s.head_x, w.data, w.grad, Tensor());
    }
  }
  logits.reset();
  if (norm_) dx = norm_->backward(dx);
  Tensor de = layers_->backward(dx);
  if (cfg_.embed_scale) ops::scale_(de, embed_scale(de.dtype()));
  return embed_->backward(de);
}

}  // namespace fsdp::nn
