// A family's state-dict adapter (torchtitan's StateDictAdapter): its parameters' names in the
// three namings fsdp.cpp reads and writes (ours, nn::Transformer's; Hugging Face's; llama.cpp's
// GGUF), the split of our packed q/k/v in-projection into the three tensors the other two name
// apart, and what llama.cpp's converter does to the family's tensors and keys (its
// general.architecture, whether it permuted the q/k rows, norms stored as 1 + w, the sliding
// window key, how its SentencePiece vocabulary is spelled). Each family's adapter lives in its
// folder (src/models/<family>/) and is found through its spec (ModelSpec::adapter, spec.h): the
// checkpoint layer's readers and exports ask it and name no family.
//
//   const models::StateDictAdapter& a = *models::spec_of(cfg).adapter;
//   a.rename("layers.0.norm1.weight", Naming::ours, Naming::gguf);   // "blk.0.attn_norm.weight"
//   a.in_proj_names("layers.0.attn.in_proj_weight", Naming::hf);     // q_proj, k_proj, v_proj
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/nn/transformer.h"

namespace fsdp::models {

enum class Naming { ours, hf, gguf };

// One parameter's name in each naming, after the block's prefix for a block's parameter ("" where
// a naming has none).
struct NameRow {
  std::string_view ours, hf, gguf;
};

// Our packed in-projection ("layers.N.attn.in_proj_weight") and its bias, which the other namings
// split into q, k and v.
inline bool is_in_proj(std::string_view n) {
  return n.find(".attn.in_proj_weight") != std::string_view::npos;
}
inline bool is_in_proj_bias(std::string_view n) {
  return n.find(".attn.in_proj_bias") != std::string_view::npos;
}

struct StateDictAdapter {
  // The names outside the blocks ("embed.weight", ...).
  std::span<const NameRow> top = {};
  // The names after a block's prefix ("layers.N.", "model.layers.N.", "blk.N."): the family's own
  // rows first (they replace a shared row of the same name: Gemma's pre-FFN norm is our norm2),
  // then the shared ones.
  std::span<const NameRow> own_block = {}, block = {};
  // The in-projection's parts in the other namings: q, k, v weights, then q, k, v biases (6 rows).
  std::span<const NameRow> qkv = {};
  // Block parameters stacked over experts in ours ([E, ...]: an MoE's experts) that the other
  // namings hold one tensor per expert: `ours` after the block's prefix, and the others' names
  // with "{}" where the expert's index goes ("mlp.experts.{}.gate_proj.weight"; "" where the
  // naming has none).
  std::span<const NameRow> stacked = {};

  // llama.cpp's general.architecture, the prefix of its <arch>.* keys ("": the family has no GGUF
  // export and its files are not read).
  std::string_view gguf_arch = {};
  // Whether llama.cpp's converter left q and k in Hugging Face's half-split rotary order (NEOX rope
  // in llama.cpp too) rather than permuting them to neighbouring pairs (llama's).
  bool gguf_half_split = false;
  // Norm weights stored as 1 + w (llama.cpp's converter for (1 + w) norms); ours hold w.
  bool gguf_norm_plus_one = false;
  // <arch>.attention.sliding_window written where the model has a window.
  bool gguf_sliding_window = false;
  // The tensors llama.cpp's converter adds beside the parameters, by name (llama's: Llama 3's
  // rope scaling as rope_freqs.weight, the factor each frequency is divided by). Null: none.
  std::vector<std::pair<std::string, Tensor>> (*gguf_extra_tensors)(
      const nn::TransformerConfig& config) = nullptr;
  // Its SentencePiece vocabulary as llama.cpp writes it: scores by id (none in the file), runs of
  // spaces stored as spaces (transformers spells them U+2581); and the other architectures whose
  // files spell their vocabulary so (their weights are not read here).
  bool gguf_spm_by_id = false;
  std::span<const std::string_view> gguf_spm_by_id_arches = {};
  // A mixture of experts' width (MoEConfig::hidden) as <arch>.expert_feed_forward_length beside
  // the dense blocks' feed_forward_length (qwen3moe); false: feed_forward_length is the experts'
  // width (llama's architecture with experts, Mixtral's).
  bool gguf_expert_ffn_key = false;

  // `name` (in naming `from`) in naming `to`; "" when it has none there: a name `from` does not
  // have, one of Hugging Face's or GGUF's q, k or v asked for in ours, or our in-projection asked
  // for in another (its parts are in_proj_names).
  std::string rename(const std::string& name, Naming from, Naming to) const;
  // The q, k and v names, in `to` (hf or gguf), of our in-projection `ours` (weight or bias) of
  // block N.
  std::array<std::string, 3> in_proj_names(const std::string& ours, Naming to) const;
  // The names, in `to`, of each of the `count` experts of our stacked parameter `ours`; empty when
  // `ours` is not a stacked one (or `to` names none).
  std::vector<std::string> stacked_names(const std::string& ours, Naming to, int64_t count) const;
  // Whether a GGUF of general.architecture `arch` spells its SentencePiece vocabulary this
  // family's way (gguf_spm_by_id).
  bool spells_spm_by_id(std::string_view arch) const;
};

}  // namespace fsdp::models
