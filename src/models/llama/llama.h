// The llama family's parts that its relatives share (qwen2 and qwen3 are llama with q/k/v biases
// or QK-norm; gemma3 builds and parallelizes as llama does). Private to src/models/.
#pragma once

#include <array>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/models/spec.h"

namespace fsdp::models::llama {

extern const ModelSpec spec;  // the llama family's (spec.cpp)

// nn::Transformer of the config.
std::unique_ptr<nn::Transformer> build(const nn::TransformerConfig& config);
// fully_shard on each block, then on the root (or replicate), then activation checkpointing.
Parallelized parallelize(nn::Transformer& model, const Parallelism& p);
// Every config value that changes the function, not just the shapes: a resume with another rope
// theta or norm epsilon would go on training a different model from the checkpoint's weights.
// (A LoRA run's adapters, "lora", are part of the model: a resume must have the same ones.)
// Gemma 3's options are among them: a resume without --geglu, or with another window, would
// compute another function of the same weights.
inline constexpr std::array<std::string_view, 23> kShapeKeys = {
    "arch",          "vocab",           "dim",          "layers",         "heads",
    "ffn_hidden",    "kv_heads",        "head_dim",     "tie_embeddings", "qkv_bias",
    "qk_norm",       "rope_theta",      "rope_scaling", "norm_eps",       "lora",
    "norm_plus_one", "sandwich_norms",  "geglu",        "embed_scale",    "sliding_window",
    "global_every",  "rope_local_theta", "moe"};
std::vector<profiler::GemmShape> gemm_shapes(const nn::TransformerConfig& config);

// Whether a llama config has any of Gemma 3's options (then it is gemma3's, or no family's).
bool has_gemma_options(const nn::TransformerConfig& c);

// A config.json of LlamaForCausalLM's form, for `model_type` (llama, qwen2 or qwen3): the sizes,
// rope_theta and Llama 3's rope scaling (transformers 4's rope_scaling and 5's rope_parameters),
// GQA, head_dim, tie_word_embeddings; attention_bias, mlp_bias, sliding windows and another
// activation refused by name. qwen2 sets qkv_bias, qwen3 qk_norm.
nn::TransformerConfig read_hf_config(const std::string& text, const std::string& where,
                                     std::string_view model_type);
// config.json's model fields of LlamaForCausalLM's form for the family `spec`.
nlohmann::json hf_config(const nn::TransformerConfig& c, const ModelSpec& spec);
// A GGUF header of llama.cpp's architecture `arch` (llama, qwen2, qwen3 or qwen3moe), read by its
// <arch>.* keys; qwen2's biases and qwen3's q/k norms are required of their files and refused in
// others; llama's and qwen3moe's experts (expert_count) are an MoE in every block.
nn::TransformerConfig read_gguf_keys(const GgufHeader& f, const std::string& arch);
// Llama 3's rope scaling refused for llama.cpp architectures that take none (qwen2, qwen3).
void check_no_rope_scaling_in_gguf(const nn::TransformerConfig& c, std::string_view arch);

// transformers' MoE families add the router's load-balancing loss (router_aux_loss_coef, default
// 0.001) to the loss only with output_router_logits: our MoEConfig::aux_coef, from and to a
// config.json (qwen3_moe, mixtral).
double read_router_aux_coef(const nlohmann::json& j, const std::string& where);
void write_router_aux_coef(const nn::TransformerConfig& c, nlohmann::json& j);

// A relative's spec functions, by its spec (Relative: &<family>::spec), for a relative whose
// config.json is LlamaForCausalLM's form under its model_type and whose GGUF keys are llama's under
// its architecture, with no rope scaling there (qwen2, qwen3): what their specs share.
template <const ModelSpec* Relative>
nn::TransformerConfig read_relative_hf(const std::string& text, const std::string& where) {
  return read_hf_config(text, where, Relative->hf_model_type);
}
template <const ModelSpec* Relative>
nn::TransformerConfig read_relative_gguf(const GgufHeader& f) {
  return read_gguf_keys(f, std::string(Relative->adapter->gguf_arch));
}
template <const ModelSpec* Relative>
void check_relative_gguf(const nn::TransformerConfig& c) {
  check_no_rope_scaling_in_gguf(c, Relative->adapter->gguf_arch);
}

}  // namespace fsdp::models::llama
