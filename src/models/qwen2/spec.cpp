// The qwen2 family (Qwen2, Qwen2.5): llama with biases on q, k and v (none on o_proj), its
// rotary embedding half-split in llama.cpp too.
#include "fsdp/models/spec.h"

#include <map>
#include <string>

#include "src/models/llama/llama.h"
#include "src/models/llama/names.h"

namespace fsdp::models::qwen2 {

extern const ModelSpec spec;

namespace {

bool matches(const nn::TransformerConfig& c) {
  return c.arch == nn::Arch::decoder && c.qkv_bias && !c.qk_norm && !llama::has_gemma_options(c) &&
         !c.moe.enabled();
}

std::string write(const nn::TransformerConfig& c) {
  nlohmann::json j = llama::hf_config(c, spec);
  j.erase("attention_bias");  // Qwen2's biases are on q, k and v always
  j["use_sliding_window"] = false;
  return j.dump();
}

}  // namespace

// llama's names; llama.cpp's converter left q and k half-split.
constexpr StateDictAdapter adapter =
    llama::relative_adapter({.gguf_arch = "qwen2", .gguf_half_split = true});

const ModelSpec spec = {
    .name = "qwen2",
    .what = "Qwen2 and Qwen2.5: llama with q/k/v biases",
    .arch = nn::Arch::decoder,
    .hf_model_type = "qwen2",
    .hf_class = "Qwen2ForCausalLM",
    .adapter = &adapter,
    .matches = matches,
    .read_hf_config = llama::read_relative_hf<&spec>,
    .write_hf_config = write,
    .read_gguf_config = llama::read_relative_gguf<&spec>,
    .check_gguf = llama::check_relative_gguf<&spec>,
    .build = llama::build,
    .parallelize = llama::parallelize,
    .shape_keys = llama::kShapeKeys,
    .gemm_shapes = llama::gemm_shapes,
};

}  // namespace fsdp::models::qwen2
