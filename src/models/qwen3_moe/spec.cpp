// The qwen3_moe family (Qwen3MoeForCausalLM: Qwen3-30B-A3B and its kind): Qwen3's attention
// (QK-norm, GQA, no biases) with a mixture of experts in place of the FFN in every block that
// decoder_sparse_step picks and mlp_only_layers leaves dense (nn::MoE: softmax over the experts,
// top k, renormalized when norm_topk_prob; its load-balancing loss times router_aux_loss_coef when
// output_router_logits, as transformers adds it). Its experts are stacked parameters
// ("layers.N.ffn.experts.gate_proj" [E, H, dim]) that Hugging Face holds one tensor per expert
// ("model.layers.N.mlp.experts.E.gate_proj.weight"): the adapter's stacked rows.
// Its GGUF is llama.cpp's qwen3moe (q and k in Hugging Face's half-split order, as qwen3's): the
// router "blk.N.ffn_gate_inp.weight", the experts one 3-D tensor per projection
// ("blk.N.ffn_gate_exps.weight", ne [dim, H, E]), expert_count, expert_used_count and
// expert_feed_forward_length. llama.cpp's qwen3moe renormalizes the top k's weights and has an MoE
// in every block: a model without norm_topk_prob, or with a dense block, is refused by name.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/models/spec.h"
#include "src/core/json_fields.h"
#include "src/core/json_read.h"
#include "src/models/llama/llama.h"
#include "src/models/llama/names.h"

namespace fsdp::models::qwen3_moe {

extern const ModelSpec spec;

namespace {

using json = nlohmann::json;

bool matches(const nn::TransformerConfig& c) {
  return c.arch == nn::Arch::decoder && c.qk_norm && !c.qkv_bias && !llama::has_gemma_options(c) &&
         c.moe.enabled() && c.moe.router == nn::RouterKind::softmax_topk;
}

nn::TransformerConfig read(const std::string& text, const std::string& where) {
  // Qwen3's part (sizes, rope, GQA, QK-norm; the dense blocks' intermediate_size), then the MoE.
  nn::TransformerConfig c = llama::read_hf_config(text, where, "qwen3");
  const json j = json_read::parse(text, where, "[hf]", json_read::kSmallMaxBytes);
  namespace jf = json_fields;
  auto field = [&](const char* key) { return jf::Field{"[hf]", where, key}; };
  auto integer = [&](const char* key, int64_t fallback) {
    const json* v = jf::member(j, key);
    return v ? field(key).integer(*v) : fallback;
  };
  auto boolean = [&](const char* key, bool fallback) {
    const json* v = jf::member(j, key);
    return v ? field(key).boolean(*v) : fallback;
  };
  // transformers' Qwen3MoeConfig defaults where a key is absent.
  nn::MoEConfig& m = c.moe;
  // transformers 4 writes num_experts, transformers 5 num_local_experts (Mixtral's name).
  m.experts = integer("num_local_experts", integer("num_experts", 128));
  FSDP_CHECK(!jf::member(j, "num_experts") || !jf::member(j, "num_local_experts") ||
                 integer("num_experts", 0) == m.experts,
             "[hf] {}: num_experts {} and num_local_experts {} disagree", where,
             integer("num_experts", 0), m.experts);
  m.top_k = integer("num_experts_per_tok", 8);
  m.hidden = integer("moe_intermediate_size", 768);
  m.norm_topk_prob = boolean("norm_topk_prob", false);
  m.sparse_step = integer("decoder_sparse_step", 1);
  if (const json* dense = jf::member(j, "mlp_only_layers"); dense && !dense->is_null()) {
    const jf::Field f = field("mlp_only_layers");
    if (!dense->is_array()) f.wrong("an array of layer indices", *dense);
    for (size_t i = 0; i < dense->size(); ++i) m.dense_layers.push_back(f.at(i).integer((*dense)[i]));
  }
  m.aux_coef = llama::read_router_aux_coef(j, where);
  FSDP_CHECK(m.experts > 0, "[hf] {}: num_experts {} must be positive (a dense model is qwen3's)",
             where, m.experts);
  FSDP_CHECK(m.sparse_step > 0, "[hf] {}: decoder_sparse_step {} must be positive", where,
             m.sparse_step);
  c.validate();
  return c;
}

std::string write(const nn::TransformerConfig& c) {
  json j = llama::hf_config(c, spec);
  j["use_sliding_window"] = false;
  j["num_experts"] = c.moe.experts;
  j["num_experts_per_tok"] = c.moe.top_k;
  j["moe_intermediate_size"] = c.moe.hidden;
  j["norm_topk_prob"] = c.moe.norm_topk_prob;
  j["decoder_sparse_step"] = c.moe.sparse_step;
  j["mlp_only_layers"] = c.moe.dense_layers;
  llama::write_router_aux_coef(c, j);
  return j.dump();
}

// What llama.cpp's qwen3moe cannot represent, by name.
void check_gguf(const nn::TransformerConfig& c) {
  llama::check_no_rope_scaling_in_gguf(c, "qwen3moe");
  FSDP_CHECK(c.moe.norm_topk_prob,
             "[gguf] qwen3_moe: norm_topk_prob false (the top k's weights not renormalized) is not "
             "representable in llama.cpp's qwen3moe, which always renormalizes them; export to "
             "Hugging Face's format instead");
  const int64_t sparse = c.moe.sparse_layers(c.layers);
  FSDP_CHECK(sparse == c.layers,
             "[gguf] qwen3_moe: {} of {} blocks are dense (mlp_only_layers {}, decoder_sparse_step "
             "{}); llama.cpp's qwen3moe has a mixture of experts in every block; export to Hugging "
             "Face's format instead",
             c.layers - sparse, c.layers, fmt::join(c.moe.dense_layers, ","), c.moe.sparse_step);
}

// The router's rows and the experts' 3-D tensors in llama.cpp's naming, then the experts' stacked
// rows in Hugging Face's.
constexpr NameRow kMoeBlockNames[] = {
    {"ffn.gate.weight", "mlp.gate.weight", "ffn_gate_inp.weight"},
    {"ffn.experts.gate_proj", "", "ffn_gate_exps.weight"},
    {"ffn.experts.up_proj", "", "ffn_up_exps.weight"},
    {"ffn.experts.down_proj", "", "ffn_down_exps.weight"},
};
constexpr NameRow kStackedNames[] = {
    {"ffn.experts.gate_proj", "mlp.experts.{}.gate_proj.weight", ""},
    {"ffn.experts.up_proj", "mlp.experts.{}.up_proj.weight", ""},
    {"ffn.experts.down_proj", "mlp.experts.{}.down_proj.weight", ""},
};

}  // namespace

constexpr StateDictAdapter adapter = llama::moe_adapter(
    {.gguf_arch = "qwen3moe", .gguf_half_split = true, .gguf_expert_ffn_key = true},
    kMoeBlockNames, kStackedNames);

const ModelSpec spec = {
    .name = "qwen3_moe",
    .what = "Qwen3-MoE: Qwen3's attention with a mixture of experts (dropless, top k) as the FFN",
    .arch = nn::Arch::decoder,
    .hf_model_type = "qwen3_moe",
    .hf_class = "Qwen3MoeForCausalLM",
    .adapter = &adapter,
    .matches = matches,
    .read_hf_config = read,
    .write_hf_config = write,
    .read_gguf_config = llama::read_relative_gguf<&spec>,
    .check_gguf = check_gguf,
    .build = llama::build,
    .parallelize = llama::parallelize,
    .shape_keys = llama::kShapeKeys,
    .gemm_shapes = llama::gemm_shapes,
};

}  // namespace fsdp::models::qwen3_moe
