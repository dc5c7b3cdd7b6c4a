// The gemma3 family (Gemma 3 270M, 1B): QK-norm, (1 + w) RMSNorms before and after attention and
// the FFN, GeGLU (gelu's tanh form), the embedding scaled by sqrt(dim), head dim 256, sliding-
// window attention on the local layers (every Nth layer global) with their own rope base, a tied
// head. Hugging Face's Gemma3ForCausalLM (model_type gemma3_text); llama.cpp's gemma3.
#include "fsdp/models/spec.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/core/error.h"
#include "src/core/json_fields.h"
#include "src/models/llama/llama.h"
#include "src/models/llama/names.h"

namespace fsdp::models::gemma3 {

extern const ModelSpec spec;

namespace {

using json = nlohmann::json;

bool matches(const nn::TransformerConfig& c) {
  return c.arch == nn::Arch::decoder && c.qk_norm && c.norm_plus_one && c.sandwich_norms && c.geglu &&
         c.embed_scale && !c.qkv_bias &&
         !c.moe.enabled();
}

// A Gemma3ForCausalLM config.json (model_type gemma3_text) as our config: arch llama with QK-norm,
// (1 + w) and sandwich norms, GeGLU, the embedding scaled, head_dim, sliding_window on the layers
// layer_types (or sliding_window_pattern) names sliding, rope_theta on the global ones and
// rope_local_base_freq on the local ones, tied. Refuses by name what the model cannot hold: a
// query_pre_attn_scalar other than head_dim, logit softcapping, rope scaling, biases, a layer
// pattern that is not "every Nth global", another activation, bidirectional attention.
nn::TransformerConfig read(const std::string& text, const std::string& where) {
  const json j = json_read::parse(text, where, "[hf]", json_read::kSmallMaxBytes);
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
               json_read::brief(j[key]), what);
  };
  nn::TransformerConfig c;
  c.arch = nn::Arch::decoder;
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

// Gemma3ForCausalLM's config.json.
std::string write(const nn::TransformerConfig& cfg) {
  FSDP_CHECK(!cfg.rope_scaling.enabled(), "[hf] Gemma3ForCausalLM takes no llama3 rope scaling");
  json types = json::array();
  for (int64_t i = 0; i < cfg.layers; ++i)
    types.push_back(cfg.layer_global(i) ? "full_attention" : "sliding_attention");
  const json j = {
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
  return j.dump();
}

// The model config of a gemma3 GGUF file (gemma3.* keys). llama.cpp's gemma3 takes what the file
// does not say from its own constants, as this does: every 6th layer global (the others windowed
// by gemma3.attention.sliding_window), the local layers' rope base 10000, queries scaled by
// 1/sqrt(head dim). Refuses rope scaling (Gemma 3 1B and up scale the global layers' rope).
nn::TransformerConfig read_gguf(const GgufHeader& f) {
  nn::TransformerConfig c;
  c.arch = nn::Arch::decoder;
  c.dim = f.get_int("gemma3.embedding_length");
  c.layers = f.get_int("gemma3.block_count");
  c.heads = f.get_int("gemma3.attention.head_count");
  c.kv_heads = f.get_int("gemma3.attention.head_count_kv", c.heads);
  c.ffn_hidden = f.get_int("gemma3.feed_forward_length");
  c.head_dim = f.get_int("gemma3.attention.key_length", c.heads > 0 ? c.dim / c.heads : 0);
  const int64_t value_length = f.get_int("gemma3.attention.value_length", c.head_dim);
  FSDP_CHECK(value_length == c.head_dim,
             "[gguf] {}: gemma3.attention.value_length {} differs from key_length {}", f.path(),
             value_length, c.head_dim);
  if (const int64_t ctx = f.get_int("gemma3.context_length", 0); ctx > 0) c.seq = ctx;
  c.rope_theta = f.get_float("gemma3.rope.freq_base", 1e6);
  c.rope_local_theta = 10000.0;
  c.norm_eps = f.get_float("gemma3.attention.layer_norm_rms_epsilon", 1e-6);
  c.sliding_window = f.get_int("gemma3.attention.sliding_window", 0);
  c.global_every = c.sliding_window > 0 ? 6 : 0;
  const std::string scaling = f.get_string("gemma3.rope.scaling.type", "none");
  FSDP_CHECK(scaling == "none",
             "[gguf] {}: gemma3.rope.scaling.type '{}' is not supported (the global layers' "
             "rope scaled)",
             f.path(), scaling);
  c.qk_norm = c.norm_plus_one = c.sandwich_norms = c.geglu = c.embed_scale = true;
  const std::vector<int64_t> embd = f.tensor_ne("token_embd.weight");
  FSDP_CHECK(embd.size() == 2 && embd[0] == c.dim,
             "[gguf] {}: token_embd.weight has ne [{}]; dim {} needs [{}, vocab]", f.path(),
             fmt::join(embd, ", "), c.dim, c.dim);
  c.vocab = embd[1];
  c.tie_embeddings = !f.contains("output.weight");
  c.validate();
  return c;
}

// llama.cpp's gemma3 takes its window pattern (every 6th layer global), its local layers' rope
// base (10000) and its query scale (1/sqrt(head dim)) as constants: a model that differs would
// load as another model, so it is refused.
void check_gguf(const nn::TransformerConfig& cfg) {
  FSDP_CHECK((cfg.sliding_window == 0 || cfg.global_every == 6) && cfg.rope_local_theta == 10000.0,
             "[gguf] llama.cpp's gemma3 makes every 6th layer global with a local rope base of "
             "10000; this model's global_every {} and rope_local_theta {} would load as another "
             "model",
             cfg.global_every, cfg.rope_local_theta);
  llama::check_no_rope_scaling_in_gguf(cfg, "gemma3");
}

}  // namespace

// Gemma's sandwich block: its pre-FFN norm (our norm2) is Hugging Face's pre_feedforward_layernorm,
// its post_attention_layernorm the attention output's norm (looked up before llama's rows).
constexpr NameRow kSandwichNames[] = {
    {"norm2.weight", "pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_attn_norm.weight", "post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"post_ffn_norm.weight", "post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};
// llama.cpp's earlier Gemmas, whose vocabularies are written as Gemma 3's.
constexpr std::string_view kOlderGemmaArchs[] = {"gemma", "gemma2"};
// llama.cpp's gemma converters: q and k half-split, (1 + w) norms stored as 1 + w, the window as
// a key, the SentencePiece vocabulary scored by id with runs of spaces stored as spaces.
constexpr StateDictAdapter adapter = llama::relative_adapter(
    {.gguf_arch = "gemma3",
     .gguf_half_split = true,
     .gguf_norm_plus_one = true,
     .gguf_sliding_window = true,
     .gguf_spm_by_id = true,
     .gguf_spm_by_id_arches = kOlderGemmaArchs},
    kSandwichNames);

// It builds and parallelizes as llama does (Gemma's options are nn::Transformer's).
const ModelSpec spec = {
    .name = "gemma3",
    .what =
        "Gemma 3: QK-norm, (1 + w) sandwich norms, GeGLU, a scaled embedding, sliding-window "
        "local layers, a tied head",
    .arch = nn::Arch::decoder,
    .hf_model_type = "gemma3_text",
    .hf_class = "Gemma3ForCausalLM",
    .adapter = &adapter,
    .matches = matches,
    .read_hf_config = read,
    .write_hf_config = write,
    .read_gguf_config = read_gguf,
    .check_gguf = check_gguf,
    .build = llama::build,
    .parallelize = llama::parallelize,
    .shape_keys = llama::kShapeKeys,
    .gemm_shapes = llama::gemm_shapes,
};

}  // namespace fsdp::models::gemma3
