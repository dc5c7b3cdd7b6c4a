// The mistral family (Mistral 7B v0.1, and its small relatives): llama with sliding-window
// attention on every layer (Hugging Face's sliding_window: query t sees keys t-window+1..t). A
// Mistral config.json without a window (v0.2 and later: sliding_window null) is llama's model
// exactly, and reads as the llama family. llama.cpp converts Mistral to its llama architecture,
// which has no window, so a windowed model has no GGUF export.
#include "fsdp/models/spec.h"

#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "fsdp/core/error.h"
#include "src/core/json_fields.h"
#include "src/models/llama/llama.h"
#include "src/models/llama/names.h"

namespace fsdp::models::mistral {

extern const ModelSpec spec;

namespace {

bool matches(const nn::TransformerConfig& c) {
  return c.arch == nn::Arch::decoder && c.sliding_window > 0 && c.global_every == 0 &&
         c.rope_local_theta == 0 && !c.qkv_bias && !c.qk_norm && !c.norm_plus_one &&
         !c.sandwich_norms && !c.geglu && !c.embed_scale &&
         !c.moe.enabled();
}

nn::TransformerConfig read(const std::string& text, const std::string& where) {
  nn::TransformerConfig c = llama::read_hf_config(text, where, "mistral");
  const nlohmann::json j = json_read::parse(text, where, "[hf]", json_read::kSmallMaxBytes);
  if (const nlohmann::json* w = json_fields::member(j, "sliding_window")) {
    c.sliding_window = json_fields::Field{"[hf]", where, "sliding_window"}.integer(*w);
    FSDP_CHECK(c.sliding_window > 0, "[hf] {}: sliding_window {} must be > 0 (or null: none)",
               where, c.sliding_window);
    // Every layer is windowed, and a windowed layer's rotary embedding is never scaled here.
    FSDP_CHECK(!c.rope_scaling.enabled(),
               "[hf] {}: rope scaling beside a sliding window on every layer is not supported",
               where);
  }
  c.validate();
  return c;
}

std::string write(const nn::TransformerConfig& c) {
  nlohmann::json j = llama::hf_config(c, spec);
  j["sliding_window"] = c.sliding_window;
  return j.dump();
}

}  // namespace

// llama's names (MistralForCausalLM's are LlamaForCausalLM's); no GGUF export (llama.cpp reads
// Mistral as "llama", without its window).
constexpr StateDictAdapter adapter = llama::relative_adapter({});

const ModelSpec spec = {
    .name = "mistral",
    .what = "Mistral: llama with a sliding window on every layer",
    .arch = nn::Arch::decoder,
    .hf_model_type = "mistral",
    .hf_class = "MistralForCausalLM",
    .adapter = &adapter,
    .matches = matches,
    .read_hf_config = read,
    .write_hf_config = write,
    .read_gguf_config = nullptr,
    .check_gguf = nullptr,
    .build = llama::build,
    .parallelize = llama::parallelize,
    .shape_keys = llama::kShapeKeys,
    .gemm_shapes = llama::gemm_shapes,
};

}  // namespace fsdp::models::mistral
