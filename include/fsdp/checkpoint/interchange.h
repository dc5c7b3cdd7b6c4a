// Handing models to other tools, and taking them back:
//   - consolidate(): the full tensors of a sharded checkpoint, in one process;
//   - the `seed` architecture keeps PyTorch's state_dict names as they are;
//   - the `llama` architecture maps to Hugging Face's LlamaForCausalLM names
//     (the packed in-projection splits into q_proj, k_proj, v_proj) with a
//     config.json. Our rotary pairs are half-split like Hugging Face's, so q
//     and k rows are not permuted there;
//   - GGUF v3 for llama.cpp, whose rotary embedding pairs neighbours: q and k
//     rows are permuted (the inverse of the permutation Hugging Face applied
//     to Meta's weights), and the vocab is byte-level, token i = "<0xNN>".
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/nn/minillm.h"

namespace fsdp::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Reads every shard of a checkpoint directory (checking checksums) and
// returns the full parameters in named_parameters() order, and the config.
NamedTensors consolidate(const std::string& ckpt_path, nn::MiniLLMConfig* cfg);

// Our names -> Hugging Face LlamaForCausalLM names (llama architecture).
NamedTensors to_hf_llama(const nn::MiniLLMConfig& cfg, const NamedTensors& ours);
std::string hf_llama_config_json(const nn::MiniLLMConfig& cfg, DType dtype);
// Our parameter name -> Hugging Face's ("" for the packed in-projection, which splits in three).
std::string hf_name(const std::string& ours);
// Parameter `name` from a file in our names or in Hugging Face's.
Tensor read_param(const SafetensorsIndex& file, const nn::MiniLLMConfig& cfg,
                  const std::string& name);

// Writes a GGUF v3 file for llama.cpp (llama architecture; F32, F16 or BF16 tensors).
void write_gguf(const std::string& path, const nn::MiniLLMConfig& cfg, const NamedTensors& ours,
                DType dtype);

}  // namespace fsdp::checkpoint
