// The qwen3 family: llama with an RMSNorm over each head of q and of k before the rotary embedding
// (QK-norm), no biases, an explicit head dim, tied or untied; half-split rotary rows in llama.cpp.
#include "fsdp/models/spec.h"

#include <map>
#include <string>

#include "src/models/llama/llama.h"

namespace fsdp::models::qwen3 {

extern const ModelSpec spec;

namespace {

bool matches(const nn::TransformerConfig& c) {
  return c.arch == nn::Arch::llama && c.qk_norm && !c.qkv_bias && !llama::has_gemma_options(c);
}

nn::TransformerConfig read(const std::string& text, const std::string& where) {
  return llama::read_hf_config(text, where, "qwen3");
}

std::string write(const nn::TransformerConfig& c) {
  nlohmann::json j = llama::hf_config(c, spec);
  j["use_sliding_window"] = false;
  return j.dump();
}

void check_gguf(const nn::TransformerConfig& c) {
  llama::check_no_rope_scaling_in_gguf(c, "qwen3");
}

nn::TransformerConfig read_gguf(const GgufHeader& f) { return llama::read_gguf_keys(f, "qwen3"); }

}  // namespace

const ModelSpec spec = {
    .name = "qwen3",
    .what = "Qwen3: llama with QK-norm and no biases",
    .arch = nn::Arch::llama,
    .hf_model_type = "qwen3",
    .hf_class = "Qwen3ForCausalLM",
    .gguf_arch = "qwen3",
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

}  // namespace fsdp::models::qwen3
