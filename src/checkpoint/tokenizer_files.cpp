// The files beside a Hugging Face export's weights: config.json (the family's, from its spec in
// src/models/), tokenizer.json with tokenizer_config.json, chat_template.jinja and
// generation_config.json, and the checkpoint's tokenizer_meta.json (TokenizerMeta). Special ids
// come from TokenizerMeta when a pretrained model gave them, else from the tokenizer's guesses.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/interchange.h"
#include "fsdp/models/spec.h"
#include "src/core/json_read.h"

namespace fsdp::checkpoint {

using json = nlohmann::json;

std::string TokenizerMeta::to_json() const {
  // A template read from a file may hold bytes that are not UTF-8: written escaped (\xNN).
  json j = {{"chat_template", json_read::utf8_safe(chat_template)}, {"pre", pre}};
  j["bos_token_id"] = bos ? json(*bos) : json(nullptr);
  j["eos_token_id"] = eos ? json(*eos) : json(nullptr);
  return j.dump(2);
}

TokenizerMeta TokenizerMeta::from_json(const std::string& text, const std::string& where) {
  try {
    const json j = json_read::parse(text, where, "[checkpoint]", json_read::kSmallMaxBytes);
    TokenizerMeta m;
    m.chat_template = j.value("chat_template", "");
    m.pre = j.value("pre", "");
    if (j.contains("bos_token_id") && !j["bos_token_id"].is_null())
      m.bos = j["bos_token_id"].get<int32_t>();
    if (j.contains("eos_token_id") && !j["eos_token_id"].is_null())
      m.eos = j["eos_token_id"].get<int32_t>();
    return m;
  } catch (const json::exception& e) {
    FSDP_FAIL("[checkpoint] {} is not a tokenizer_meta.json: {}", where, e.what());
  }
}

std::string hf_config_json(const nn::TransformerConfig& cfg, DType dtype,
                           const data::Tokenizer& tok, const TokenizerMeta& meta) {
  const models::ModelSpec& spec = models::spec_of(cfg);
  FSDP_CHECK(spec.write_hf_config, "[hf] the {} family has no Hugging Face class ({})", spec.name,
             spec.what);
  json j = json::parse(spec.write_hf_config(cfg));
  j["torch_dtype"] = dtype == DType::bf16  ? "bfloat16"
                     : dtype == DType::f16 ? "float16"
                                           : "float32";
  if (auto bos = meta.bos ? meta.bos : tok.bos_id()) j["bos_token_id"] = *bos;
  if (auto eos = meta.eos ? meta.eos : tok.eos_id()) j["eos_token_id"] = *eos;
  return j.dump(2);
}

std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(
    const nn::TransformerConfig& cfg, const data::Tokenizer& tok, const TokenizerMeta& meta) {
  auto token = [&](std::optional<int32_t> id) -> json {
    return id ? json(tok.tokens()[size_t(*id)]) : json(nullptr);
  };
  const std::optional<int32_t> bos = meta.bos ? meta.bos : tok.bos_id(),
                               eos = meta.eos ? meta.eos : tok.eos_id();
  json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"bos_token", token(bos)},
                 {"eos_token", token(eos)},
                 {"add_bos_token", tok.text_prefix_id().has_value()},
                 {"add_eos_token", false},
                 {"clean_up_tokenization_spaces", false},
                 {"model_max_length", cfg.seq}};
  if (!meta.chat_template.empty())
    config["chat_template"] = json_read::utf8_safe(meta.chat_template);
  json gen = {{"_from_model_config", true}};
  if (bos) gen["bos_token_id"] = *bos;
  if (eos) gen["eos_token_id"] = *eos;
  std::vector<std::pair<std::string, std::string>> files = {
      {"tokenizer.json", tok.json()},
      {"tokenizer_config.json", config.dump(2)},
      {"generation_config.json", gen.dump(2)}};
  // transformers 5 saves the template beside tokenizer_config.json and reads it from there first:
  // the text as the model came with it, byte for byte.
  if (!meta.chat_template.empty()) files.emplace_back("chat_template.jinja", meta.chat_template);
  return files;
}

}  // namespace fsdp::checkpoint
