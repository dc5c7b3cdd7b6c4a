// The mixtral family (MixtralForCausalLM): llama's attention (GQA, no biases, no QK-norm) with a
// mixture of experts as every block's FFN (nn::MoE with Mixtral's router: the top k of the logits,
// softmax over the k; its load-balancing loss times router_aux_loss_coef when
// output_router_logits, as transformers adds it). Hugging Face holds the experts one tensor per
// expert ("model.layers.N.block_sparse_moe.experts.E.w1.weight": w1 the gate, w3 the up, w2 the
// down projection): the adapter's stacked rows. A sliding window and router jitter noise are
// refused by name. Its GGUF is llama.cpp's llama with experts (as convert_hf_to_gguf.py writes
// Mixtral: q and k permuted to neighbouring rotary pairs, the router "blk.N.ffn_gate_inp.weight",
// the experts one 3-D tensor per projection, "blk.N.ffn_gate_exps.weight" ne [dim, H, E],
// expert_count, expert_used_count, feed_forward_length the experts' width).
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

namespace fsdp::models::mixtral {

extern const ModelSpec spec;

namespace {

using json = nlohmann::json;

bool matches(const nn::TransformerConfig& c) {
  return c.arch == nn::Arch::decoder && !c.qk_norm && !c.qkv_bias && !llama::has_gemma_options(c) &&
         c.moe.enabled() && c.moe.router == nn::RouterKind::topk_softmax &&
         c.moe.sparse_layers(c.layers) == c.layers;
}

nn::TransformerConfig read(const std::string& text, const std::string& where) {
  json j = json_read::parse(text, where, "[hf]", json_read::kSmallMaxBytes);
  namespace jf = json_fields;
  FSDP_CHECK(j.is_object(), "[hf] {}: expected a JSON object, got {}", where, jf::described(j));
  auto field = [&](const char* key) { return jf::Field{"[hf]", where, key}; };
  if (const json* w = jf::member(j, "sliding_window"); w && !w->is_null())
    FSDP_FAIL("[hf] {}: sliding_window {} (sliding-window attention) is not supported for "
              "mixtral; expected null",
              where, w->dump());
  if (const json* n = jf::member(j, "router_jitter_noise"))
    FSDP_CHECK(field("router_jitter_noise").number(*n) == 0,
               "[hf] {}: router_jitter_noise {} is not supported; expected 0", where, n->dump());
  if (const json* h = jf::member(j, "head_dim"); h && h->is_null()) j.erase("head_dim");
  // llama's part: sizes, rope, GQA; intermediate_size is each expert's width.
  nn::TransformerConfig c = llama::read_hf_config(j.dump(), where, "mixtral");
  auto integer = [&](const char* key, int64_t fallback) {
    const json* v = jf::member(j, key);
    return v ? field(key).integer(*v) : fallback;
  };
  nn::MoEConfig& m = c.moe;
  m.router = nn::RouterKind::topk_softmax;
  m.experts = integer("num_local_experts", 8);
  m.top_k = integer("num_experts_per_tok", 2);
  m.hidden = c.ffn_hidden;
  m.aux_coef = llama::read_router_aux_coef(j, where);
  FSDP_CHECK(m.experts > 0, "[hf] {}: num_local_experts {} must be positive", where, m.experts);
  c.validate();
  return c;
}

std::string write(const nn::TransformerConfig& c) {
  json j = llama::hf_config(c, spec);
  j["intermediate_size"] = c.moe.hidden;
  j["num_local_experts"] = c.moe.experts;
  j["num_experts_per_tok"] = c.moe.top_k;
  j["sliding_window"] = nullptr;
  j["router_jitter_noise"] = 0.0;
  llama::write_router_aux_coef(c, j);
  return j.dump();
}

constexpr NameRow kMoeBlockNames[] = {
    {"ffn.gate.weight", "block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
    {"ffn.experts.gate_proj", "", "ffn_gate_exps.weight"},
    {"ffn.experts.up_proj", "", "ffn_up_exps.weight"},
    {"ffn.experts.down_proj", "", "ffn_down_exps.weight"},
};
constexpr NameRow kStackedNames[] = {
    {"ffn.experts.gate_proj", "block_sparse_moe.experts.{}.w1.weight", ""},
    {"ffn.experts.up_proj", "block_sparse_moe.experts.{}.w3.weight", ""},
    {"ffn.experts.down_proj", "block_sparse_moe.experts.{}.w2.weight", ""},
};

}  // namespace

constexpr StateDictAdapter adapter =
    llama::moe_adapter({.gguf_arch = "llama"}, kMoeBlockNames, kStackedNames);

const ModelSpec spec = {
    .name = "mixtral",
    .what = "Mixtral: llama's attention with a mixture of experts (top k, softmax over the k) in "
            "every block",
    .arch = nn::Arch::decoder,
    .hf_model_type = "mixtral",
    .hf_class = "MixtralForCausalLM",
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

}  // namespace fsdp::models::mixtral
