// The llama family's parameter names in the three namings fsdp.cpp reads and writes: ours
// (nn::Transformer's), Hugging Face's (LlamaForCausalLM, Qwen2ForCausalLM) and llama.cpp's (GGUF).
// One table (param_names.cpp) that every reader and writer maps through: load_pretrained, the
// Hugging Face and GGUF exports and the GGUF-to-Hugging Face names. Our q, k and v are one packed
// in-projection ("layers.N.attn.in_proj_weight" and its bias), which the other two name apart.
#pragma once

#include <array>
#include <string>

namespace fsdp::checkpoint::detail {

inline bool is_in_proj(const std::string& n) {
  return n.find(".attn.in_proj_weight") != std::string::npos;
}
inline bool is_in_proj_bias(const std::string& n) {
  return n.find(".attn.in_proj_bias") != std::string::npos;
}

enum class Naming { ours, hf, gguf };

// `name` (in naming `from`) in naming `to`; "" when it has none there: a name `from` does not
// have, one of HF's or GGUF's q, k or v asked for in ours, or our in-projection asked for in
// another (its parts are in_proj_names). sandwich: a block with norms on the attention's and the
// FFN's outputs (Gemma), whose pre-FFN norm (our norm2) Hugging Face calls
// pre_feedforward_layernorm, its post_attention_layernorm being the attention's output norm.
std::string rename(const std::string& name, Naming from, Naming to, bool sandwich = false);
// The q, k and v names, in `to`, of our in-projection `ours` (weight or bias) of block N.
std::array<std::string, 3> in_proj_names(const std::string& ours, Naming to);

}  // namespace fsdp::checkpoint::detail
