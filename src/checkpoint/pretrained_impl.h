// load_pretrained's internals (private to src/checkpoint): the mapped files behind a Pretrained,
// and what pretrained.cpp (the formats), pretrained_tokenizer.cpp (tokenizers, chat templates,
// generation configs) and pretrained_rows.cpp (each rank's rows of a weight) share.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/core/tensor.h"
#include "fsdp/data/tokenizer.h"

namespace fsdp::checkpoint {

struct PretrainedSource {
  std::string path;
  std::optional<GgufFile> gguf;
  std::vector<SafetensorsFile> files;  // mapped
  std::map<std::string, const Tensor*> by_name;

  const Tensor* find(const std::string& name) const {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  }
};

namespace pretrained_detail {

// A model folder's text file, whole (a regular file of at most 64 MiB, or refused by name).
std::string read_text(const std::filesystem::path& p);
// The id of token `text`, if the vocabulary has it.
std::optional<int32_t> token_id(const data::Tokenizer& tok, const std::string& text);
// End of turn: ChatML's <|im_end|> when the template uses it, else EOS.
void set_eot(Pretrained& p);
// The tokenizer files of a Hugging Face folder: tokenizer.json, tokenizer_config.json's chat
// template and special tokens, generation_config.json's ids.
void read_hf_tokenizer(Pretrained& p, const std::filesystem::path& dir);
// Every stored tensor of the first block has the shape the config implies (before any rank reads).
void check_one_layer_shapes(const Pretrained& p, const PretrainedSource& src);

}  // namespace pretrained_detail

}  // namespace fsdp::checkpoint
