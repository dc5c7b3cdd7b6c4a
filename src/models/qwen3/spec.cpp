// The qwen3 family: llama with an RMSNorm over each head of q and of k before the rotary embedding
// (QK-norm), no biases, an explicit head dim, tied or untied; half-split rotary rows in llama.cpp.
#include "fsdp/models/spec.h"

#include <map>
#include <string>

#include "src/models/llama/llama.h"
#include "src/models/llama/names.h"

namespace fsdp::models::qwen3 {

extern const ModelSpec spec;

namespace {

bool matches(const nn::TransformerConfig& c) {
  return c.arch == nn::Arch::decoder && c.qk_norm && !c.qkv_bias && !llama::has_gemma_options(c) &&
         !c.moe.enabled();
}

std::string write(const nn::TransformerConfig& c) {
  nlohmann::json j = llama::hf_config(c, spec);
  j["use_sliding_window"] = false;
  return j.dump();
}

}  // namespace

// llama's names; llama.cpp's converter left q and k half-split.
constexpr StateDictAdapter adapter =
    llama::relative_adapter({.gguf_arch = "qwen3", .gguf_half_split = true});

const ModelSpec spec = {
    .name = "qwen3",
    .what = "Qwen3: llama with QK-norm and no biases",
    .arch = nn::Arch::decoder,
    .hf_model_type = "qwen3",
    .hf_class = "Qwen3ForCausalLM",
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

}  // namespace fsdp::models::qwen3
