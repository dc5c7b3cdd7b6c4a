// The llama family's state-dict adapter (fsdp/models/state_dict_adapter.h): LlamaForCausalLM's and
// llama.cpp's names of nn::Transformer's parameters. Its relatives (qwen2, qwen3, mistral, gemma3)
// build theirs from these rows with their own llama.cpp options (relative_adapter), gemma3 with its
// sandwich norms' rows first. Constant data in a header, so that every family's adapter is
// constant-initialized (no order of static initialization between the folders' files).
#pragma once

#include <array>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/nn/transformer.h"

#include "fsdp/models/state_dict_adapter.h"

namespace fsdp::models::llama {

inline constexpr NameRow kTopNames[] = {
    {"embed.weight", "model.embed_tokens.weight", "token_embd.weight"},
    {"norm.weight", "model.norm.weight", "output_norm.weight"},
    {"head.weight", "lm_head.weight", "output.weight"},
};
// After a block's prefix: "layers.N.", "model.layers.N.", "blk.N.". (The q/k norms are qwen3's
// and gemma3's; a model without them has no such parameter.)
inline constexpr NameRow kBlockNames[] = {
    {"norm1.weight", "input_layernorm.weight", "attn_norm.weight"},
    {"attn.out_proj.weight", "self_attn.o_proj.weight", "attn_output.weight"},
    {"norm2.weight", "post_attention_layernorm.weight", "ffn_norm.weight"},
    {"ffn.w1.weight", "mlp.gate_proj.weight", "ffn_gate.weight"},
    {"ffn.w3.weight", "mlp.up_proj.weight", "ffn_up.weight"},
    {"ffn.w2.weight", "mlp.down_proj.weight", "ffn_down.weight"},
    {"attn.q_norm.weight", "self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"attn.k_norm.weight", "self_attn.k_norm.weight", "attn_k_norm.weight"},
};
// The split of our packed in-projection: q, k, v weights, then their biases (qwen2's).
inline constexpr std::array<NameRow, 6> kQkvNames = {{
    {"", "self_attn.q_proj.weight", "attn_q.weight"},
    {"", "self_attn.k_proj.weight", "attn_k.weight"},
    {"", "self_attn.v_proj.weight", "attn_v.weight"},
    {"", "self_attn.q_proj.bias", "attn_q.bias"},
    {"", "self_attn.k_proj.bias", "attn_k.bias"},
    {"", "self_attn.v_proj.bias", "attn_v.bias"},
}};

// Llama 3's rope scaling as llama.cpp's converter writes it (rope_freqs.weight), where the config
// has one (spec.cpp; a relative whose architecture takes none refuses such a config first).
std::vector<std::pair<std::string, Tensor>> gguf_rope_freqs(const nn::TransformerConfig& config);

// llama's names with a relative's llama.cpp options (its gguf_arch, ...) and its own block rows.
constexpr StateDictAdapter relative_adapter(StateDictAdapter options,
                                            std::span<const NameRow> own_block = {}) {
  options.gguf_extra_tensors = gguf_rope_freqs;
  options.top = kTopNames;
  options.own_block = own_block;
  options.block = kBlockNames;
  options.qkv = kQkvNames;
  return options;
}

// A mixture of experts of llama's form (qwen3_moe, mixtral) with its llama.cpp options: llama's
// names, the family's own rows (the router; the experts' stacked tensors as llama.cpp holds them,
// one 3-D tensor per projection: "ffn_gate_exps.weight" [E, H, dim], ne [dim, H, E]), and its
// experts' stacked rows in Hugging Face's naming (StateDictAdapter::stacked).
constexpr StateDictAdapter moe_adapter(StateDictAdapter options, std::span<const NameRow> own_block,
                                       std::span<const NameRow> stacked) {
  StateDictAdapter a = relative_adapter(options, own_block);
  a.stacked = stacked;
  return a;
}

}  // namespace fsdp::models::llama
