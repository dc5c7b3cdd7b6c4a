// The qwen2 family (Qwen2, Qwen2.5): llama with biases on q, k and v (none on o_proj), its
// rotary embedding half-split in llama.cpp too.
#include "fsdp/models/spec.h"

#include <map>
#include <string>

#include "src/models/llama/llama.h"

namespace fsdp::models::qwen2 {

extern const ModelSpec spec;

namespace {

bool matches(const nn::TransformerConfig& c) {
  return c.arch == nn::Arch::llama && c.qkv_bias && !c.qk_norm && !llama::has_gemma_options(c);
}

nn::TransformerConfig read(const std::string& text, const std::string& where) {
  return llama::read_hf_config(text, where, "qwen2");
}

std::string write(const nn::TransformerConfig& c) {
  nlohmann::json j = llama::hf_config(c, spec);
  j.erase("attention_bias");  // Qwen2's biases are on q, k and v always
  j["use_sliding_window"] = false;
  return j.dump();
}

void check_gguf(const nn::TransformerConfig& c) {
  llama::check_no_rope_scaling_in_gguf(c, "qwen2");
}

nn::TransformerConfig read_gguf(const GgufHeader& f) { return llama::read_gguf_keys(f, "qwen2"); }

}  // namespace

const ModelSpec spec = {
    .name = "qwen2",
    .what = "Qwen2 and Qwen2.5: llama with q/k/v biases",
    .arch = nn::Arch::llama,
    .hf_model_type = "qwen2",
    .hf_class = "Qwen2ForCausalLM",
    .gguf_arch = "qwen2",
    .gguf_half_split = true,
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

}  // namespace fsdp::models::qwen2
