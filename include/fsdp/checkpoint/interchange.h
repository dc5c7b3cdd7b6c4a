// Handing models to other tools, and taking them back:
//   - consolidate(): the full tensors of a sharded checkpoint, in one process;
//   - the names are the family's, its state-dict adapter's
//     (fsdp/models/state_dict_adapter.h); the seed family keeps PyTorch's
//     state_dict names as they are; the others map to their Hugging Face
//     class's names (the packed in-projection splits into q_proj, k_proj,
//     v_proj) with a config.json. Our rotary pairs are half-split like
//     Hugging Face's, so q and k rows are not permuted there;
//   - GGUF v3 for llama.cpp, in the architecture, names and keys the
//     family's adapter gives: q and k rows are permuted where llama.cpp's
//     rotary embedding pairs neighbours (the inverse of the permutation
//     Hugging Face applied to Meta's weights);
//   - the tokenizer goes with the weights: tokenizer.json (with its config
//     files) beside a Hugging Face export, and a "gpt2" vocabulary (GPT-2's
//     byte-level tokens, the merges, the "gpt-2" pre-tokenizer, no BOS added)
//     in the GGUF, so llama.cpp tokenizes text as we do.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/state_dict_adapter.h"
#include "fsdp/nn/transformer.h"

namespace fsdp::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// What a pretrained model's tokenizer carries beyond tokenizer.json: its own special ids (not
// guessed from token names), its chat template and llama.cpp's pre-tokenizer name ("smollm").
// fsdp-train saves it in checkpoints (tokenizer_meta.json) when it starts from a pretrained
// model, and the exports write it back: tokenizer_config.json's chat_template, bos/eos in
// generation_config.json and config.json, and GGUF's tokenizer.ggml.pre, bos/eos ids and
// tokenizer.chat_template. Empty fields: the exports' defaults (the tokenizer's guesses, "gpt-2").
struct TokenizerMeta {
  std::optional<int32_t> bos, eos;
  std::string chat_template, pre;
  std::string to_json() const;
  static TokenizerMeta from_json(const std::string& json, const std::string& where);
};

// Reads every shard of a checkpoint directory (checking checksums) and
// returns the full parameters in named_parameters() order, and the config.
// A LoRA checkpoint (adapters only) gets its base as the run built it: the --init-from model its
// config names, refused when its content changed since, or the run's seed's initialisation. With
// merge (the default) the adapters are folded into the base weights (merge_lora) and *cfg has no
// LoRA: the model every export and fsdp-generate take; without, the adapters stay beside the base.
NamedTensors consolidate(const std::string& ckpt_path, nn::TransformerConfig* cfg,
                         bool merge = true);
// W + (alpha / rank) B A for every adapted weight of a LoRA model's tensors (cfg.lora), computed
// in f64 and stored in the weight's dtype (f32 for a bf16 or f16 weight); the adapters dropped.
NamedTensors merge_lora(const nn::TransformerConfig& cfg, const NamedTensors& with_adapters);
// A LoRA model's adapters in PEFT's format (Hugging Face's names): adapter_model.safetensors's
// tensors ("base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight" [r, in], lora_B
// [out, r]; the packed in-projection's pair split into q_proj's, k_proj's and v_proj's), and its
// adapter_config.json (r, lora_alpha, target_modules; base: base_model_name_or_path).
NamedTensors to_peft(const nn::TransformerConfig& cfg, const NamedTensors& with_adapters);
// The base a LoRA checkpoint names (the run's --init-from; "" for a base from its seed).
std::string lora_base_path(const std::string& ckpt_path);
std::string peft_adapter_config_json(const nn::TransformerConfig& cfg, const std::string& base);

// The packed in-projection's rows, [begin, end) for q_proj, k_proj and v_proj in that order:
// "layers.N.attn.in_proj_weight" is [(heads + 2 kv_heads) head_dim, dim] and
// "layers.N.attn.in_proj_bias" (qkv_bias) [(heads + 2 kv_heads) head_dim].
std::array<std::pair<int64_t, int64_t>, 3> in_proj_rows(const nn::TransformerConfig& cfg);

// Our names -> Hugging Face's, as the state-dict adapter of cfg's family names them (q, k and v
// apart); refused by name for a family with only our own names (seed). A tied model has no
// lm_head.weight.
NamedTensors to_hf(const nn::TransformerConfig& cfg, const NamedTensors& ours);
// config.json of cfg's family (its spec's Hugging Face class, models::spec_of), with the dtype and
// the tokenizer's BOS and EOS; refused by name for a family without a Hugging Face class (seed).
std::string hf_config_json(const nn::TransformerConfig& cfg, DType dtype,
                           const data::Tokenizer& tok = data::Tokenizer::bytes(),
                           const TokenizerMeta& meta = {});
// tokenizer.json, tokenizer_config.json and generation_config.json of a Hugging Face folder
// (name -> contents), with the tokenizer's BOS and EOS, and chat_template.jinja, the template as it
// came (also in tokenizer_config.json), when the model has one.
std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(
    const nn::TransformerConfig& cfg, const data::Tokenizer& tok, const TokenizerMeta& meta = {});
// Our parameter name -> Hugging Face's in the family's naming (`names`, its state-dict adapter);
// "" for the packed in-projection and its bias, which split in three; a name the adapter does not
// know stays as it is.
std::string hf_name(const models::StateDictAdapter& names, const std::string& ours);
// (Reading parameters from a file in our names, Hugging Face's or llama.cpp's, one rank's rows at a
// time: load_pretrained in fsdp/checkpoint/pretrained.h.)

// Writes a GGUF v3 file for llama.cpp (the architecture of cfg's family, as its state-dict adapter
// names it and its tensors; F32, F16 or BF16 tensors; head_count_kv and key_length from kv_heads and head_dim; no
// output.weight when the head is tied, so llama.cpp uses token_embd.weight) with the tokenizer
// as a "gpt2" vocabulary of cfg.vocab tokens (ids past the tokenizer's are UNUSED).
// A vocabulary without merges (the bytes) gets one that can never apply (a letter then a digit,
// which GPT-2's split keeps apart), since llama.cpp refuses none; one without BOS and EOS gets
// control tokens for them in unused ids where the model has two to spare.
void write_gguf(const std::string& path, const nn::TransformerConfig& cfg, const NamedTensors& ours,
                DType dtype, const data::Tokenizer& tok = data::Tokenizer::bytes(),
                const TokenizerMeta& meta = {});
// A LoRA model's adapters as a GGUF LoRA adapter for llama.cpp's --lora (general.type adapter,
// adapter.type lora, adapter.lora.alpha; "<base weight>.lora_a" [rank, in] and ".lora_b" [out,
// rank] in f32, B's q and k rows permuted as the base's are), for the GGUF write_gguf makes of the
// base: `with_adapters` holds the adapters (consolidate without merging).
void write_gguf_lora(const std::string& path, const nn::TransformerConfig& cfg,
                     const NamedTensors& with_adapters);

}  // namespace fsdp::checkpoint
