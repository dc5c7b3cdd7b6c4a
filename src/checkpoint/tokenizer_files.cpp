// The files beside a Hugging Face export's weights, and the config read back from one: config.json
// (LlamaForCausalLM or Qwen2ForCausalLM, both ways), tokenizer.json with tokenizer_config.json and
// generation_config.json, and the checkpoint's tokenizer_meta.json (TokenizerMeta). Special ids
// come from TokenizerMeta when a pretrained model gave them, else from the tokenizer's guesses.
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

namespace fsdp::checkpoint {

using json = nlohmann::json;

std::string TokenizerMeta::to_json() const {
  json j = {{"chat_template", chat_template}, {"pre", pre}};
  j["bos_token_id"] = bos ? json(*bos) : json(nullptr);
  j["eos_token_id"] = eos ? json(*eos) : json(nullptr);
  return j.dump(2);
}

TokenizerMeta TokenizerMeta::from_json(const std::string& text, const std::string& where) {
  try {
    const json j = json::parse(text);
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

std::string hf_llama_config_json(const nn::MiniLLMConfig& cfg, DType dtype,
                                 const data::Tokenizer& tok, const TokenizerMeta& meta) {
  // q/k/v biases without an o_proj bias are Qwen2's attention (Llama's attention_bias puts one on
  // o_proj too); the rest of Qwen2ForCausalLM is Llama's.
  const bool qwen2 = cfg.qkv_bias;
  json j = {{"architectures", {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
            {"model_type", qwen2 ? "qwen2" : "llama"},
            {"hidden_size", cfg.dim},
            {"intermediate_size", cfg.resolved_ffn_hidden()},
            {"num_attention_heads", cfg.heads},
            {"num_key_value_heads", cfg.resolved_kv_heads()},
            {"head_dim", cfg.resolved_head_dim()},
            {"num_hidden_layers", cfg.layers},
            {"vocab_size", cfg.vocab},
            {"max_position_embeddings", cfg.seq},
            {"rms_norm_eps", cfg.norm_eps.value_or(1.1920928955078125e-07)},
            {"rope_theta", cfg.rope_theta},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", cfg.tie_embeddings},
            {"attention_bias", false},
            {"torch_dtype", dtype == DType::bf16  ? "bfloat16"
                            : dtype == DType::f16 ? "float16"
                                                  : "float32"}};
  if (qwen2) {
    j.erase("attention_bias");
    j["use_sliding_window"] = false;
  }
  if (auto bos = meta.bos ? meta.bos : tok.bos_id()) j["bos_token_id"] = *bos;
  if (auto eos = meta.eos ? meta.eos : tok.eos_id()) j["eos_token_id"] = *eos;
  return j.dump(2);
}

nn::MiniLLMConfig config_from_hf_llama(const std::string& text, const std::string& where,
                                       bool* tied) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    FSDP_FAIL("[hf] {} is not valid JSON: {}", where, e.what());
  }
  const std::string model_type = j.value("model_type", "");
  FSDP_CHECK(model_type == "llama" || model_type == "qwen2",
             "[hf] {}: model_type '{}' is not supported; expected llama (LlamaForCausalLM) or "
             "qwen2 (Qwen2ForCausalLM)",
             where, model_type);
  auto num = [&](const char* key) -> int64_t {
    FSDP_CHECK(j.contains(key) && j[key].is_number_integer(), "[hf] {}: no integer '{}'", where,
               key);
    return j[key].get<int64_t>();
  };
  nn::MiniLLMConfig c;
  c.arch = nn::Arch::llama;
  c.dim = num("hidden_size");
  c.ffn_hidden = num("intermediate_size");
  c.heads = num("num_attention_heads");
  c.layers = num("num_hidden_layers");
  c.vocab = num("vocab_size");
  c.seq = j.value("max_position_embeddings", c.seq);
  c.norm_eps = j.value("rms_norm_eps", 1e-6);
  c.rope_theta = j.value("rope_theta", 10000.0);
  const bool qwen2 = model_type == "qwen2";
  c.kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                   ? num("num_key_value_heads")
                   : c.heads;
  FSDP_CHECK(c.kv_heads > 0 && c.heads % c.kv_heads == 0,
             "[hf] {}: num_attention_heads {} is not a multiple of num_key_value_heads {}", where,
             c.heads, c.kv_heads);
  if (j.contains("head_dim") && !j["head_dim"].is_null()) c.head_dim = num("head_dim");
  // Llama's attention_bias is on q, k, v and o; Qwen2's biases are on q, k and v only.
  FSDP_CHECK(!j.value("attention_bias", false),
             "[hf] {}: attention_bias true (a bias on o_proj too) is not supported", where);
  FSDP_CHECK(!j.value("mlp_bias", false), "[hf] {}: mlp_bias true is not supported", where);
  FSDP_CHECK(!qwen2 || !j.value("use_sliding_window", false),
             "[hf] {}: use_sliding_window true (sliding-window attention) is not supported", where);
  c.qkv_bias = qwen2;
  FSDP_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(),
             "[hf] {}: rope_scaling {} is not supported", where, j["rope_scaling"].dump());
  FSDP_CHECK(j.value("hidden_act", "silu") == "silu",
             "[hf] {}: hidden_act '{}' is not supported; expected silu", where,
             j.value("hidden_act", ""));
  // transformers' default for both classes: untied.
  c.tie_embeddings = j.value("tie_word_embeddings", false);
  if (tied) *tied = c.tie_embeddings;
  c.validate();
  return c;
}

std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const nn::MiniLLMConfig& cfg,
                                                                    const data::Tokenizer& tok,
                                                                    const TokenizerMeta& meta) {
  auto token = [&](std::optional<int32_t> id) -> json {
    return id ? json(tok.tokens()[size_t(*id)]) : json(nullptr);
  };
  const std::optional<int32_t> bos = meta.bos ? meta.bos : tok.bos_id(),
                               eos = meta.eos ? meta.eos : tok.eos_id();
  json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"bos_token", token(bos)},
                 {"eos_token", token(eos)},
                 {"add_bos_token", false},
                 {"add_eos_token", false},
                 {"clean_up_tokenization_spaces", false},
                 {"model_max_length", cfg.seq}};
  if (!meta.chat_template.empty()) config["chat_template"] = meta.chat_template;
  json gen = {{"_from_model_config", true}};
  if (bos) gen["bos_token_id"] = *bos;
  if (eos) gen["eos_token_id"] = *eos;
  return {{"tokenizer.json", tok.json()},
          {"tokenizer_config.json", config.dump(2)},
          {"generation_config.json", gen.dump(2)}};
}

}  // namespace fsdp::checkpoint
