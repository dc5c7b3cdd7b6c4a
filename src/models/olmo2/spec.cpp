// The olmo2 family (OLMo-2 1B to 32B, Hugging Face's Olmo2ForCausalLM): its own block (olmo2.h:
// norms after the attention and after the FFN, QK-norm over the whole projection width), rope,
// SwiGLU, grouped-query attention, an untied head; its options under "olmo2" in the config JSON.
// Its config.json is LlamaForCausalLM's form with OLMo-2's defaults (rms_norm_eps 1e-5) and its
// attention_bias; its Hugging Face names are llama's with its two norms. llama.cpp's olmo2 is not
// written here: a GGUF export is refused by name.
#include "fsdp/models/spec.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fsdp/core/error.h"
#include "fsdp/nn/transformer.h"
#include "src/core/json_fields.h"
#include "src/core/json_read.h"
#include "src/models/llama/llama.h"
#include "src/models/llama/names.h"
#include "src/models/olmo2/olmo2.h"

namespace fsdp::models::olmo2 {

extern const ModelSpec spec;

namespace {

using json = nlohmann::json;

// The config is OLMo-2's by its "family" key alone (no config of the older families names it); of
// the shared options it holds only llama's form's sizes.
bool matches(const nn::TransformerConfig& c) {
  if (c.family != "olmo2") return false;
  (void)options_of(c);  // refuses, by field, options that are not OLMo-2's
  return c.arch == nn::Arch::decoder && !c.qkv_bias && !c.qk_norm && !llama::has_gemma_options(c) &&
         !c.moe.enabled() && !c.rope_scaling.enabled();
}

nn::TransformerConfig read(const std::string& text, const std::string& where) {
  json j = json_read::parse(text, where, "[hf]", json_read::kSmallMaxBytes);
  json_fields::Field{"[hf]", where, "config"}.object(j);
  Options o;
  if (const json* bias = json_fields::member(j, "attention_bias"))
    o.attention_bias = json_fields::Field{"[hf]", where, "attention_bias"}.boolean(*bias);
  FSDP_CHECK(!json_fields::member(j, "rope_scaling"),
             "[hf] {}: rope_scaling {} is not supported for olmo2 (unscaled RoPE only)", where,
             json_read::brief(j["rope_scaling"]));
  j.erase("attention_bias");  // llama's reader refuses it: a bias on o_proj is OLMo-2's option
  if (!json_fields::member(j, "rms_norm_eps")) j["rms_norm_eps"] = 1e-5;  // Olmo2Config's default
  nn::TransformerConfig c = llama::read_hf_config(j.dump(), where, "olmo2");
  c.family = "olmo2";
  c.family_options = options_json(o);
  c.validate();
  return c;
}

std::string write(const nn::TransformerConfig& c) {
  json j = llama::hf_config(c, spec);
  j["attention_bias"] = options_of(c).attention_bias;
  return j.dump();
}

std::unique_ptr<nn::Transformer> build(const nn::TransformerConfig& c) {
  return std::make_unique<nn::Transformer>(c, spec.block);
}

// nn::TransformerBlock's count (two norms a block, the attention, the FFN, the final norm, the
// head, LoRA's adapters) with the q and k norms over the whole width and the attention's biases.
int64_t num_parameters(const nn::TransformerConfig& c) {
  const int64_t hd = c.resolved_head_dim(), q = c.heads * hd, kv = c.resolved_kv_heads() * hd;
  const int64_t biases = options_of(c).attention_bias ? q + 2 * kv + c.dim : 0;
  return c.num_parameters() + c.layers * (q + kv + biases);
}

// llama's keys, and the family with its options: a resume must build the same block.
constexpr std::array<std::string_view, llama::kShapeKeys.size() + 2> kShapeKeys = [] {
  std::array<std::string_view, llama::kShapeKeys.size() + 2> keys{};
  for (size_t i = 0; i < llama::kShapeKeys.size(); ++i) keys[i] = llama::kShapeKeys[i];
  keys[llama::kShapeKeys.size()] = "family";
  keys[llama::kShapeKeys.size() + 1] = "olmo2";
  return keys;
}();

// OLMo-2's own rows: its norms after the sublayers, and o_proj's bias (attention_bias).
constexpr NameRow kOwnBlockNames[] = {
    {"post_attn_norm.weight", "post_attention_layernorm.weight", ""},
    {"post_ffn_norm.weight", "post_feedforward_layernorm.weight", ""},
    {"attn.out_proj.bias", "self_attn.o_proj.bias", ""},
};

}  // namespace

// llama's names with OLMo-2's norms; no llama.cpp architecture here (gguf_arch "").
constexpr StateDictAdapter adapter = llama::relative_adapter({}, kOwnBlockNames);

const ModelSpec spec = {
    .name = "olmo2",
    .what =
        "OLMo-2: norms after the attention and the FFN, QK-norm over the whole width, RoPE, "
        "SwiGLU, untied head (its GGUF export, llama.cpp's olmo2, is not written here)",
    .arch = nn::Arch::decoder,
    .hf_model_type = "olmo2",
    .hf_class = "Olmo2ForCausalLM",
    .adapter = &adapter,
    .matches = matches,
    .read_hf_config = read,
    .write_hf_config = write,
    .read_gguf_config = nullptr,
    .check_gguf = nullptr,
    .build = build,
    .parallelize = llama::parallelize,
    .shape_keys = kShapeKeys,
    .gemm_shapes = llama::gemm_shapes,
    .num_parameters = num_parameters,
    .block = make_block,
};

}  // namespace fsdp::models::olmo2
