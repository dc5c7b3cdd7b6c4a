// The files beside a Hugging Face export's weights, and the config read back from one: config.json
// (LlamaForCausalLM or Qwen2ForCausalLM, both ways), tokenizer.json with tokenizer_config.json and
// generation_config.json, and the checkpoint's tokenizer_meta.json (TokenizerMeta). Special ids
// come from TokenizerMeta when a pretrained model gave them, else from the tokenizer's guesses.
#include <algorithm>
#include <cmath>
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
#include "fsdp/ops/rope.h"
#include "src/checkpoint/json_fields.h"

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

namespace {
// Gemma3ForCausalLM's config.json.
json hf_gemma3_config(const nn::MiniLLMConfig& cfg) {
  json types = json::array();
  for (int64_t i = 0; i < cfg.layers; ++i)
    types.push_back(cfg.layer_global(i) ? "full_attention" : "sliding_attention");
  return {
      {"architectures", {"Gemma3ForCausalLM"}},
      {"model_type", "gemma3_text"},
      {"hidden_size", cfg.dim},
      {"intermediate_size", cfg.resolved_ffn_hidden()},
      {"num_attention_heads", cfg.heads},
      {"num_key_value_heads", cfg.resolved_kv_heads()},
      {"head_dim", cfg.resolved_head_dim()},
      {"query_pre_attn_scalar", cfg.resolved_head_dim()},
      {"num_hidden_layers", cfg.layers},
      {"vocab_size", cfg.vocab},
      {"max_position_embeddings", cfg.seq},
      {"rms_norm_eps", cfg.norm_eps.value_or(1e-6)},
      {"rope_theta", cfg.rope_theta},
      {"rope_local_base_freq", cfg.rope_local_theta > 0 ? cfg.rope_local_theta : cfg.rope_theta},
      {"rope_scaling", nullptr},
      {"sliding_window", cfg.sliding_window > 0 ? json(cfg.sliding_window) : json(nullptr)},
      {"layer_types", types},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"final_logit_softcapping", nullptr},
      {"attn_logit_softcapping", nullptr},
      {"attention_bias", false},
      {"tie_word_embeddings", cfg.tie_embeddings}};
}
}  // namespace

std::string hf_llama_config_json(const nn::MiniLLMConfig& cfg, DType dtype,
                                 const data::Tokenizer& tok, const TokenizerMeta& meta) {
  const bool gemma3 = is_gemma3(cfg);
  FSDP_CHECK(gemma3 || (!cfg.norm_plus_one && !cfg.sandwich_norms && !cfg.geglu &&
                        !cfg.embed_scale && cfg.sliding_window == 0),
             "[hf] a model with some of Gemma's options but not all (QK-norm, (1 + w) and "
             "sandwich norms, GeGLU, the embedding scaled) is no Hugging Face class");
  FSDP_CHECK(!gemma3 || (!cfg.qkv_bias && !cfg.rope_scaling.enabled()),
             "[hf] Gemma3ForCausalLM has no q/k/v biases and no llama3 rope scaling");
  // q/k/v biases without an o_proj bias are Qwen2's attention (Llama's attention_bias puts one on
  // o_proj too); norms on q and k are Qwen3's (whose attention_bias would put one on o_proj too);
  // the rest of both is Llama's.
  FSDP_CHECK(!(cfg.qk_norm && cfg.qkv_bias),
             "[hf] a model with q/k norms and q/k/v biases (no o_proj bias) is no Hugging Face "
             "class: Qwen3's attention_bias puts a bias on o_proj too");
  const bool qwen2 = cfg.qkv_bias, qwen3 = cfg.qk_norm && !gemma3;
  json j = {{"architectures",
             {qwen3   ? "Qwen3ForCausalLM"
              : qwen2 ? "Qwen2ForCausalLM"
                      : "LlamaForCausalLM"}},
            {"model_type", qwen3   ? "qwen3"
                           : qwen2 ? "qwen2"
                                   : "llama"},
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
            {"rope_parameters", {{"rope_theta", cfg.rope_theta}, {"rope_type", "default"}}},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", cfg.tie_embeddings},
            {"attention_bias", false},
            {"torch_dtype", dtype == DType::bf16  ? "bfloat16"
                            : dtype == DType::f16 ? "float16"
                                                  : "float32"}};
  if (gemma3) {
    const json torch_dtype = j["torch_dtype"];
    j = hf_gemma3_config(cfg);
    j["torch_dtype"] = torch_dtype;
  }
  if (qwen2) j.erase("attention_bias");
  if (qwen2 || qwen3) j["use_sliding_window"] = false;
  if (const ops::RopeScaling& s = cfg.rope_scaling; s.enabled()) {
    const double ctx = s.original_context;
    json scaling = {{"rope_type", "llama3"},
                    {"factor", s.factor},
                    {"low_freq_factor", s.low_freq_factor},
                    {"high_freq_factor", s.high_freq_factor},
                    {"original_max_position_embeddings",
                     ctx == std::floor(ctx) && ctx < 9e15 ? json(int64_t(ctx)) : json(ctx)}};
    j["rope_scaling"] = scaling;  // transformers 4
    scaling["rope_theta"] = cfg.rope_theta;
    j["rope_parameters"] = scaling;  // transformers 5
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
  namespace jf = json_fields;
  FSDP_CHECK(j.is_object(), "[hf] {}: expected a JSON object, got {}", where, jf::described(j));
  auto field = [&](const char* key) { return jf::Field{"[hf]", where, key}; };
  auto opt_bool = [&](const char* key, bool fallback) {
    const json* v = jf::member(j, key);
    return v ? field(key).boolean(*v) : fallback;
  };
  const json* mt = jf::member(j, "model_type");
  const std::string model_type = mt ? field("model_type").string(*mt) : "";
  FSDP_CHECK(model_type == "llama" || model_type == "qwen2" || model_type == "qwen3",
             "[hf] {}: model_type '{}' is not supported; expected llama (LlamaForCausalLM), "
             "qwen2 (Qwen2ForCausalLM) or qwen3 (Qwen3ForCausalLM)",
             where, model_type);
  auto num = [&](const char* key) -> int64_t {
    const json* v = jf::member(j, key);
    FSDP_CHECK(v, "[hf] {}: no integer '{}'", where, key);
    return field(key).integer(*v);
  };
  nn::MiniLLMConfig c;
  c.arch = nn::Arch::llama;
  c.dim = num("hidden_size");
  c.ffn_hidden = num("intermediate_size");
  c.heads = num("num_attention_heads");
  c.layers = num("num_hidden_layers");
  c.vocab = num("vocab_size");
  if (jf::member(j, "max_position_embeddings")) c.seq = num("max_position_embeddings");
  const json* eps = jf::member(j, "rms_norm_eps");
  c.norm_eps = eps ? field("rms_norm_eps").number(*eps) : 1e-6;
  // transformers 4 writes rope_theta and rope_scaling; transformers 5 writes rope_parameters
  // {rope_theta, rope_type, and the scaling's keys}. The default (unscaled) rope and Llama 3's
  // scaling are supported.
  const json* theta = jf::member(j, "rope_theta");
  c.rope_theta = theta ? field("rope_theta").number(*theta) : 10000.0;
  // A rope_scaling or rope_parameters object as Llama 3's scaling (factor 0 for the default).
  auto scaling_of = [&](const json& obj, const jf::Field& f) {
    f.object(obj);
    const json* type = jf::member(obj, "rope_type");
    if (!type) type = jf::member(obj, "type");  // transformers' older key
    const std::string kind = type ? f.at("rope_type").string(*type) : "default";
    FSDP_CHECK(kind == "default" || kind == "llama3",
               "[hf] {}: {} with rope_type '{}' ({}) is not supported; rope_type default "
               "(unscaled RoPE) and llama3 are",
               where, f.name, kind, obj.dump());
    ops::RopeScaling s;
    if (kind == "default") return s;
    auto need = [&](const char* key) {
      const json* v = jf::member(obj, key);
      FSDP_CHECK(v, "[hf] {}: {} of rope_type llama3 has no '{}'", where, f.name, key);
      return f.at(key).number(*v);
    };
    s = {.factor = need("factor"),
         .low_freq_factor = need("low_freq_factor"),
         .high_freq_factor = need("high_freq_factor"),
         .original_context = need("original_max_position_embeddings")};
    ops::check_rope_scaling(s, "[hf] " + where + ": " + f.name);
    return s;
  };
  if (const json* rs = jf::member(j, "rope_scaling"))
    c.rope_scaling = scaling_of(*rs, field("rope_scaling"));
  if (const json* rp = jf::member(j, "rope_parameters")) {
    const jf::Field f = field("rope_parameters");
    const ops::RopeScaling s = scaling_of(*rp, f);
    FSDP_CHECK(!jf::member(j, "rope_scaling") || s == c.rope_scaling,
               "[hf] {}: rope_scaling {} and rope_parameters {} disagree", where,
               j["rope_scaling"].dump(), rp->dump());
    c.rope_scaling = s;
    if (const json* t = jf::member(*rp, "rope_theta")) {
      const double v = f.at("rope_theta").number(*t);
      FSDP_CHECK(!theta || v == c.rope_theta,
                 "[hf] {}: rope_theta {} and rope_parameters.rope_theta {} disagree", where,
                 c.rope_theta, v);
      c.rope_theta = v;
    }
  }
  const bool qwen2 = model_type == "qwen2", qwen3 = model_type == "qwen3";
  c.kv_heads = jf::member(j, "num_key_value_heads") ? num("num_key_value_heads") : c.heads;
  FSDP_CHECK(c.kv_heads > 0 && c.heads % c.kv_heads == 0,
             "[hf] {}: num_attention_heads {} is not a multiple of num_key_value_heads {}", where,
             c.heads, c.kv_heads);
  if (jf::member(j, "head_dim")) c.head_dim = num("head_dim");
  // Llama's and Qwen3's attention_bias is on q, k, v and o; Qwen2's biases are on q, k and v
  // only, always. Qwen3 norms each head of q and k.
  FSDP_CHECK(!opt_bool("attention_bias", false),
             "[hf] {}: attention_bias true (a bias on o_proj too) is not supported", where);
  FSDP_CHECK(!opt_bool("mlp_bias", false), "[hf] {}: mlp_bias true is not supported", where);
  FSDP_CHECK(!(qwen2 || qwen3) || !opt_bool("use_sliding_window", false),
             "[hf] {}: use_sliding_window true (sliding-window attention) is not supported", where);
  c.qkv_bias = qwen2;
  c.qk_norm = qwen3;
  const json* act = jf::member(j, "hidden_act");
  const std::string hidden_act = act ? field("hidden_act").string(*act) : "silu";
  FSDP_CHECK(hidden_act == "silu", "[hf] {}: hidden_act '{}' is not supported; expected silu",
             where, hidden_act);
  // transformers' default for both classes: untied.
  c.tie_embeddings = opt_bool("tie_word_embeddings", false);
  if (tied) *tied = c.tie_embeddings;
  c.validate();
  return c;
}

bool is_gemma3(const nn::MiniLLMConfig& c) {
  return c.arch == nn::Arch::llama && c.qk_norm && c.norm_plus_one && c.sandwich_norms && c.geglu &&
         c.embed_scale;
}

nn::MiniLLMConfig config_from_hf_gemma3(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    FSDP_FAIL("[hf] {} is not valid JSON: {}", where, e.what());
  }
  namespace jf = json_fields;
  FSDP_CHECK(j.is_object(), "[hf] {}: expected a JSON object, got {}", where, jf::described(j));
  auto field = [&](const char* key) { return jf::Field{"[hf]", where, key}; };
  auto num = [&](const char* key) -> int64_t {
    const json* v = jf::member(j, key);
    FSDP_CHECK(v, "[hf] {}: no integer '{}'", where, key);
    return field(key).integer(*v);
  };
  auto real = [&](const char* key, double fallback) {
    const json* v = jf::member(j, key);
    return v ? field(key).number(*v) : fallback;
  };
  auto absent = [&](const char* key, const char* what) {
    FSDP_CHECK(!jf::member(j, key), "[hf] {}: {} {} ({}) is not supported", where, key,
               j[key].dump(), what);
  };
  nn::MiniLLMConfig c;
  c.arch = nn::Arch::llama;
  c.dim = num("hidden_size");
  c.ffn_hidden = num("intermediate_size");
  c.heads = num("num_attention_heads");
  c.kv_heads = jf::member(j, "num_key_value_heads") ? num("num_key_value_heads") : c.heads;
  c.head_dim = jf::member(j, "head_dim") ? num("head_dim") : 256;  // Gemma3TextConfig's default
  c.layers = num("num_hidden_layers");
  c.vocab = num("vocab_size");
  if (jf::member(j, "max_position_embeddings")) c.seq = num("max_position_embeddings");
  c.norm_eps = real("rms_norm_eps", 1e-6);
  c.rope_theta = real("rope_theta", 1e6);
  c.rope_local_theta = real("rope_local_base_freq", 1e4);
  c.qk_norm = c.norm_plus_one = c.sandwich_norms = c.geglu = c.embed_scale = true;
  const json* tie = jf::member(j, "tie_word_embeddings");
  c.tie_embeddings = tie ? field("tie_word_embeddings").boolean(*tie) : true;
  const double scalar = real("query_pre_attn_scalar", 256.0);
  FSDP_CHECK(scalar == double(c.head_dim),
             "[hf] {}: query_pre_attn_scalar {} is not head_dim {}; attention here scales by "
             "1/sqrt(head_dim)",
             where, scalar, c.head_dim);
  absent("final_logit_softcapping", "logit softcapping");
  absent("attn_logit_softcapping", "attention logit softcapping");
  absent("rope_scaling", "Gemma 3's larger models scale the global layers' rope");
  const json* act = jf::member(j, "hidden_activation");
  const std::string hidden_act =
      act ? field("hidden_activation").string(*act) : "gelu_pytorch_tanh";
  FSDP_CHECK(hidden_act == "gelu_pytorch_tanh",
             "[hf] {}: hidden_activation '{}' is not supported; expected gelu_pytorch_tanh", where,
             hidden_act);
  for (const char* key : {"attention_bias", "use_bidirectional_attention"})
    if (const json* v = jf::member(j, key))
      FSDP_CHECK(!field(key).boolean(*v), "[hf] {}: {} true is not supported", where, key);
  // The layers' kinds: layer_types (transformers >= 4.53), else sliding_window_pattern.
  c.sliding_window = jf::member(j, "sliding_window") ? num("sliding_window") : 0;
  if (const json* lt = jf::member(j, "layer_types")) {
    const jf::Field f = field("layer_types");
    FSDP_CHECK(lt->is_array() && int64_t(lt->size()) == c.layers,
               "[hf] {}: layer_types must list the {} layers, got {}", where, c.layers,
               jf::described(*lt));
    std::vector<bool> global;
    for (size_t i = 0; i < lt->size(); ++i) {
      const std::string kind = f.at(i).string((*lt)[i]);
      FSDP_CHECK(kind == "sliding_attention" || kind == "full_attention",
                 "[hf] {}: layer_types[{}] is '{}'; expected sliding_attention or full_attention",
                 where, i, kind);
      global.push_back(kind == "full_attention");
    }
    const auto first = std::find(global.begin(), global.end(), true);
    c.global_every = first == global.end() ? 0 : int64_t(first - global.begin()) + 1;
    if (std::find(global.begin(), global.end(), false) == global.end()) c.sliding_window = 0;
  } else {
    c.global_every = jf::member(j, "sliding_window_pattern") ? num("sliding_window_pattern") : 6;
  }
  c.validate();
  if (const json* lt = jf::member(j, "layer_types"))
    for (int64_t i = 0; i < c.layers; ++i)
      FSDP_CHECK(((*lt)[size_t(i)] == "full_attention") == c.layer_global(i),
                 "[hf] {}: layer_types {} is not every {}th layer global, the pattern supported",
                 where, lt->dump(), c.global_every);
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
                 {"add_bos_token", tok.text_prefix_id().has_value()},
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
