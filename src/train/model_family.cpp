// The model-family table (fsdp/train/model_family.h).
#include "fsdp/train/model_family.h"

#include <array>
#include <cstddef>
#include <cstdint>

#include "fsdp/core/error.h"
#include "fsdp/fsdp/replicate.h"

namespace fsdp::train {

namespace {

std::unique_ptr<nn::MiniLLM> build_minillm(const nn::MiniLLMConfig& config) {
  return std::make_unique<nn::MiniLLM>(config);
}

Parallelized parallelize_minillm(nn::MiniLLM& model, const Parallelism& p) {
  Parallelized out;
  if (p.shard == ShardMode::full) {
    for (size_t i = 0; i < model.layers().size(); ++i)
      fully_shard(model.layers()[i], p.mesh, p.fsdp);
    out.parallel = out.root = &fully_shard(model, p.mesh, p.fsdp);
  } else {  // every rank holds all of it
    out.parallel =
        &replicate(model, p.mesh, {.init_dtype = p.fsdp.init_dtype, .seed = p.fsdp.seed});
  }
  // Blocks 0, N, 2N, ... keep only their input and recompute the rest in the backward.
  if (const int64_t every = p.activation_checkpoint.every; every > 0)
    for (size_t i = 0; i < model.layers().size(); i += size_t(every))
      model.layers()[i].set_activation_checkpoint(true);
  return out;
}

// Every config value that changes the function, not just the shapes: a resume with another rope
// theta or norm epsilon would go on training a different model from the checkpoint's weights.
// (A LoRA run's adapters, "lora", are part of the model: a resume must have the same ones.)
constexpr std::array<std::string_view, 15> kMiniLLMShapeKeys = {
    "arch",       "vocab",      "dim",          "layers",         "heads",
    "ffn_hidden", "kv_heads",   "head_dim",     "tie_embeddings", "qkv_bias",
    "qk_norm",    "rope_theta", "rope_scaling", "norm_eps",       "lora"};

std::vector<profiler::GemmShape> minillm_gemm_shapes(const nn::MiniLLMConfig& c) {
  const int64_t rows = c.batch * c.seq, d = c.dim, hd = c.resolved_head_dim();
  const int64_t f = c.resolved_ffn_hidden(), q = c.heads * hd;
  return {{rows, q + 2 * c.resolved_kv_heads() * hd, d},  // q, k and v, packed
          {rows, d, q},                                   // the attention's output
          {rows, f, d},                                   // the FFN's up (and gate)
          {rows, d, f},                                   // its down
          {rows, c.vocab, d},                             // the head
          {f, d, rows}};                                  // the FFN's weight gradient
}

constexpr std::array<ModelFamily, 2> kFamilies = {{
    {nn::Arch::seed, "seed",
     "the reference script's MiniLLM: bidirectional attention with biases, no positions, a "
     "SiLU FFN, no final norm",
     build_minillm, parallelize_minillm, kMiniLLMShapeKeys, minillm_gemm_shapes},
    {nn::Arch::llama, "llama",
     "Llama-family (SmolLM2, Llama 3, Qwen2.5): causal, RoPE, SwiGLU, RMSNorm, grouped-query "
     "attention, tied embeddings, q/k/v biases",
     build_minillm, parallelize_minillm, kMiniLLMShapeKeys, minillm_gemm_shapes},
}};

}  // namespace

std::span<const ModelFamily> model_families() { return kFamilies; }

const ModelFamily& model_family(nn::Arch arch) {
  for (const ModelFamily& f : kFamilies)
    if (f.arch == arch) return f;
  FSDP_FAIL("[train] no model family for arch {}", int(arch));
}

}  // namespace fsdp::train
