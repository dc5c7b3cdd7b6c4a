// The seed family: the reference PyTorch script's MiniLLM, exactly (bidirectional
// nn.MultiheadAttention with biases, no positions, a SiLU FFN, no final norm). It has no Hugging
// Face class and no llama.cpp architecture: its checkpoints export in our own names.
#include "fsdp/models/spec.h"

#include "src/models/llama/llama.h"

namespace fsdp::models::seed {

extern const ModelSpec spec;

namespace {
bool matches(const nn::TransformerConfig& c) { return c.arch == nn::Arch::seed; }
}  // namespace

// It builds, parallelizes and resumes as llama does (one module class, nn::Transformer).
const ModelSpec spec = {
    .name = "seed",
    .what =
        "the reference script's MiniLLM: bidirectional attention with biases, no positions, a "
        "SiLU FFN, no final norm",
    .arch = nn::Arch::seed,
    .hf_model_type = "",
    .hf_class = "",
    .adapter = nullptr,
    .matches = matches,
    .read_hf_config = nullptr,
    .write_hf_config = nullptr,
    .read_gguf_config = nullptr,
    .check_gguf = nullptr,
    .build = llama::build,
    .parallelize = llama::parallelize,
    .shape_keys = llama::kShapeKeys,
    .gemm_shapes = llama::gemm_shapes,
};

}  // namespace fsdp::models::seed
