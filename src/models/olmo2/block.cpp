// OLMo-2's options and its block (olmo2.h): nn's attention, norms and SwiGLU FFN composed with the
// norms after each sublayer; the backward runs them in reverse, each residual passing dy through.
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "fsdp/core/error.h"
#include "fsdp/ops/ops.h"
#include "src/core/json_fields.h"
#include "src/core/json_read.h"
#include "src/models/olmo2/olmo2.h"

namespace fsdp::models::olmo2 {

Options options_of(const nn::TransformerConfig& c) {
  Options o;
  if (c.family_options.empty()) return o;
  const std::string where = "the config's olmo2 options";
  const nlohmann::json j =
      json_read::parse(c.family_options, where, "[olmo2]", json_read::kSmallMaxBytes);
  json_fields::Field{"[olmo2]", where, "olmo2"}.object(j);
  for (const auto& [key, value] : j.items()) {
    FSDP_CHECK(key == "attention_bias",
               "[olmo2] config field 'olmo2.{}' is not an option of OLMo-2's; expected "
               "attention_bias",
               json_read::printable(key, 80));
    o.attention_bias = json_fields::Field{"[olmo2]", where, "olmo2." + key}.boolean(value);
  }
  return o;
}

std::string options_json(const Options& o) {
  return nlohmann::json{{"attention_bias", o.attention_bias}}.dump();
}

Block::Block(const nn::TransformerConfig& c, const Options& o) : Module("Olmo2Block") {
  const nn::AttentionOptions attn{.bias = o.attention_bias,
                                  .causal = true,
                                  .rope_theta = c.rope_theta,
                                  .rope_scaling = c.rope_scaling,
                                  .xavier_in_proj = false,
                                  .kv_heads = c.kv_heads,
                                  .head_dim = c.head_dim,
                                  .qk_norm = true,
                                  .qk_norm_whole = true,
                                  .norm_eps = c.norm_eps,
                                  .lora = c.lora};
  attn_ = &register_module("attn", std::make_unique<nn::MultiheadAttention>(c.dim, c.heads, attn));
  post_attn_norm_ =
      &register_module("post_attn_norm", std::make_unique<nn::RMSNorm>(c.dim, c.norm_eps));
  ffn_ = &register_module("ffn", std::make_unique<nn::FeedForward>(
                                     c.dim, c.resolved_ffn_hidden(),
                                     nn::FeedForward::Kind::swiglu, c.lora));
  post_ffn_norm_ =
      &register_module("post_ffn_norm", std::make_unique<nn::RMSNorm>(c.dim, c.norm_eps));
}

Tensor Block::forward_impl(const Tensor& x) {
  Tensor h = ops::add(x, post_attn_norm_->forward(attn_->forward(x)));
  return ops::add(h, post_ffn_norm_->forward(ffn_->forward(h)));
}

Tensor Block::backward_impl(const Tensor& dy) {
  // dy passes straight through both residuals; each branch adds its part.
  Tensor dh = ffn_->backward(post_ffn_norm_->backward(dy));
  ops::add_(dh, dy);
  Tensor dx = attn_->backward(post_attn_norm_->backward(dh));
  ops::add_(dx, dh);
  return dx;
}

std::unique_ptr<nn::Module> make_block(const nn::TransformerConfig& c, int64_t) {
  return std::make_unique<Block>(c, options_of(c));
}

}  // namespace fsdp::models::olmo2
