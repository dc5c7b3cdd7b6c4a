// The olmo2 family's parts (private to src/models/olmo2/): its options, a struct of its own saved
// under "olmo2" in the config JSON (nn::TransformerConfig::family_options), and its block.
//
// OLMo-2's block (Hugging Face's Olmo2DecoderLayer) norms the outputs of its sublayers, not their
// inputs: h = x + post_attn_norm(attn(x)), then out = h + post_ffn_norm(ffn(h)); its attention
// norms q and k over their whole projection width (one RMS per token over every head, weights
// [heads hd] and [kv_heads hd]: nn::AttentionOptions::qk_norm_whole) before the rotary embedding.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/core/tensor.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/module.h"
#include "fsdp/nn/transformer.h"

namespace fsdp::models::olmo2 {

struct Options {
  bool attention_bias = false;  // biases on q, k, v and o (Hugging Face's attention_bias)
};

// The config's "olmo2" object as Options (absent: the defaults); an unknown or mistyped field is
// refused, naming it.
Options options_of(const nn::TransformerConfig& config);
// Options as the object saved under "olmo2" (every field, so that the JSON says what it holds).
std::string options_json(const Options& options);

class Block : public nn::Module {
 public:
  Block(const nn::TransformerConfig& config, const Options& options);
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  nn::MultiheadAttention* attn_;
  nn::RMSNorm* post_attn_norm_;
  nn::FeedForward* ffn_;
  nn::RMSNorm* post_ffn_norm_;
};

// The family's block factory (nn::BlockFactory): a Block of the config's options on every layer.
std::unique_ptr<nn::Module> make_block(const nn::TransformerConfig& config, int64_t layer);

}  // namespace fsdp::models::olmo2
