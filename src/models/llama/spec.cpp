// The llama family (SmolLM2, Llama 3.x): causal, RoPE (Llama 3's scaling too), SwiGLU, RMSNorm,
// grouped-query attention, tied or untied head; and the parts its relatives share (llama.h).
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/dtensor.h"
#include "fsdp/distributed/expert_parallel.h"
#include "fsdp/distributed/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/fsdp/replicate.h"
#include "fsdp/nn/module.h"
#include "fsdp/nn/moe.h"
#include "fsdp/ops/rope.h"
#include "src/core/json_fields.h"
#include "src/models/llama/llama.h"
#include "src/models/llama/names.h"

namespace fsdp::models::llama {

using json = nlohmann::json;

std::unique_ptr<nn::Transformer> build(const nn::TransformerConfig& config) {
  return std::make_unique<nn::Transformer>(config, nn::default_block);
}

namespace {

// Runs an inner module's fully_shard hooks around the module that calls it. An MoE runs its
// experts through Experts::grouped_forward, not their own forward(), so the MoE's forward and
// backward gather the experts and reduce their gradients (the router stays the block's).
class CallerHooks : public nn::ModuleHooks {
 public:
  CallerHooks(nn::Module& inner, FSDPModule& state) : inner_(&inner), state_(&state) {}
  Tensor pre_forward(nn::Module&, const Tensor& x) override {
    return state_->pre_forward(*inner_, x);
  }
  Tensor post_forward(nn::Module&, const Tensor& y) override {
    return state_->post_forward(*inner_, y);
  }
  Tensor pre_backward(nn::Module&, const Tensor& dy) override {
    return state_->pre_backward(*inner_, dy);
  }
  Tensor post_backward(nn::Module&, const Tensor& dx) override {
    return state_->post_backward(*inner_, dx);
  }

 private:
  nn::Module* inner_;
  FSDPModule* state_;
};

// Expert parallel: each MoE holds its ep rank's E/ep experts, fully_shard'ed over the ranks that
// hold the same ones (dp_shard_mod_ep), before the blocks take the rest over the world. Each
// local expert's gradient sums the ep group's tokens, so the reduce-scatter divides by the world
// (torchtitan's gradient_divide_factor). The experts' parameters carry their placement, Shard(0)
// on the ep dim of [E, ...] (Replicate on dp_shard_mod_ep, which fully_shard shards), so the
// initialiser, checkpoints and pretrained loading see global rows.
void shard_experts(nn::Transformer& model, const std::shared_ptr<dist::DeviceMesh>& expert_mesh,
                   const FullyShardOptions& fsdp) {
  const auto ep = expert_mesh->group("ep");
  const auto experts_mesh = (*expert_mesh)["dp_shard_mod_ep"];
  const int ep_dim = expert_mesh->dim_index("ep");
  for (nn::MoE* moe : model.moe_layers()) {
    moe->set_expert_parallel(dist::expert_parallel(ep, moe->options().experts));
    nn::Module* experts = nullptr;
    for (auto& [name, child] : moe->named_children())
      if (name == "experts") experts = child;
    FSDP_CHECK(experts, "[parallelize] {} has no experts module", moe->describe());
    std::vector<dist::Placement> placements(size_t(expert_mesh->ndim()), dist::Replicate{});
    placements[size_t(ep_dim)] = dist::Shard{0};
    for (auto& [name, p] : experts->named_parameters(experts->path())) {
      Shape global = p->shape;
      global[0] = moe->options().experts;
      dist::from_local_parameter(*p, expert_mesh, placements, global, name);
    }
    FullyShardOptions o = fsdp;
    o.gradient_divide_factor = double(expert_mesh->size());
    FSDPModule& state = fully_shard(*experts, experts_mesh, o);
    moe->add_hooks(std::make_shared<CallerHooks>(*experts, state));
  }
}

}  // namespace

Parallelized parallelize(nn::Transformer& model, const Parallelism& p) {
  Parallelized out;
  const auto mesh = p.mesh ? p.mesh : dist::init_device_mesh({dist::world()->size()});
  FSDP_CHECK(!p.expert_mesh || !p.replicate,
             "[parallelize] expert parallel shards the experts with fully_shard; replicate() "
             "holds every expert on every rank");
  if (p.expert_mesh) shard_experts(model, p.expert_mesh, p.fsdp);
  if (!p.replicate) {
    for (nn::Module& block : model.layers()) fully_shard(block, mesh, p.fsdp);
    out.parallel = out.root = &fully_shard(model, mesh, p.fsdp);
  } else {  // every rank holds all of it
    out.parallel = &replicate(model, mesh, {.init_dtype = p.fsdp.init_dtype, .seed = p.fsdp.seed});
  }
  // Blocks 0, N, 2N, ... keep only their input and recompute the rest in the backward.
  if (const int64_t every = p.checkpoint_every; every > 0)
    for (size_t i = 0; i < model.layers().size(); i += size_t(every))
      model.layers()[i].set_activation_checkpoint(true);
  return out;
}

std::vector<profiler::GemmShape> gemm_shapes(const nn::TransformerConfig& c) {
  const int64_t rows = c.batch * c.seq, d = c.dim, hd = c.resolved_head_dim();
  const int64_t f = c.resolved_ffn_hidden(), q = c.heads * hd;
  std::vector<profiler::GemmShape> s = {
      {rows, q + 2 * c.resolved_kv_heads() * hd, d},  // q, k and v, packed
      {rows, d, q},                                   // the attention's output
      {rows, f, d},                                   // the FFN's up (and gate)
      {rows, d, f},                                   // its down
      {rows, c.vocab, d},                             // the head
      {f, d, rows}};                                  // the FFN's weight gradient
  if (c.moe.enabled()) {  // an expert's share of the routed rows (k / E on average), the router
    const int64_t expert_rows = std::max<int64_t>(1, rows * c.moe.top_k / c.moe.experts);
    s.push_back({expert_rows, c.moe.hidden, d});
    s.push_back({expert_rows, d, c.moe.hidden});
    s.push_back({rows, c.moe.experts, d});
  }
  return s;
}

bool has_gemma_options(const nn::TransformerConfig& c) {
  return c.norm_plus_one || c.sandwich_norms || c.geglu || c.embed_scale || c.sliding_window > 0;
}

nn::TransformerConfig read_hf_config(const std::string& text, const std::string& where,
                                     std::string_view model_type) {
  const json j = json_read::parse(text, where, "[hf]", json_read::kSmallMaxBytes);
  namespace jf = json_fields;
  FSDP_CHECK(j.is_object(), "[hf] {}: expected a JSON object, got {}", where, jf::described(j));
  auto field = [&](const char* key) { return jf::Field{"[hf]", where, key}; };
  auto opt_bool = [&](const char* key, bool fallback) {
    const json* v = jf::member(j, key);
    return v ? field(key).boolean(*v) : fallback;
  };
  auto num = [&](const char* key) -> int64_t {
    const json* v = jf::member(j, key);
    FSDP_CHECK(v, "[hf] {}: no integer '{}'", where, key);
    return field(key).integer(*v);
  };
  nn::TransformerConfig c;
  c.arch = nn::Arch::decoder;
  c.dim = num("hidden_size");
  c.ffn_hidden = num("intermediate_size");
  c.heads = num("num_attention_heads");
  c.layers = num("num_hidden_layers");
  c.vocab = num("vocab_size");
  if (jf::member(j, "max_position_embeddings")) c.seq = num("max_position_embeddings");
  const json* eps = jf::member(j, "rms_norm_eps");
  c.norm_eps = eps ? field("rms_norm_eps").number(*eps) : 1e-6;
  // transformers 4 writes rope_theta and rope_scaling; transformers 5 writes rope_parameters
  // {rope_theta, rope_type, and the scaling's keys}. The default (unscaled) rope and Llama 3's
  // scaling are supported.
  const json* theta = jf::member(j, "rope_theta");
  c.rope_theta = theta ? field("rope_theta").number(*theta) : 10000.0;
  // A rope_scaling or rope_parameters object as Llama 3's scaling (factor 0 for the default).
  auto scaling_of = [&](const json& obj, const jf::Field& f) {
    f.object(obj);
    const json* type = jf::member(obj, "rope_type");
    if (!type) type = jf::member(obj, "type");  // transformers' older key
    const std::string kind = type ? f.at("rope_type").string(*type) : "default";
    FSDP_CHECK(kind == "default" || kind == "llama3",
               "[hf] {}: {} with rope_type '{}' ({}) is not supported; rope_type default "
               "(unscaled RoPE) and llama3 are",
               where, f.name, kind, obj.dump());
    ops::RopeScaling s;
    if (kind == "default") return s;
    auto need = [&](const char* key) {
      const json* v = jf::member(obj, key);
      FSDP_CHECK(v, "[hf] {}: {} of rope_type llama3 has no '{}'", where, f.name, key);
      return f.at(key).number(*v);
    };
    s = {.factor = need("factor"),
         .low_freq_factor = need("low_freq_factor"),
         .high_freq_factor = need("high_freq_factor"),
         .original_context = need("original_max_position_embeddings")};
    ops::check_rope_scaling(s, "[hf] " + where + ": " + f.name);
    return s;
  };
  if (const json* rs = jf::member(j, "rope_scaling"))
    c.rope_scaling = scaling_of(*rs, field("rope_scaling"));
  if (const json* rp = jf::member(j, "rope_parameters")) {
    const jf::Field f = field("rope_parameters");
    const ops::RopeScaling s = scaling_of(*rp, f);
    FSDP_CHECK(!jf::member(j, "rope_scaling") || s == c.rope_scaling,
               "[hf] {}: rope_scaling {} and rope_parameters {} disagree", where,
               j["rope_scaling"].dump(), rp->dump());
    c.rope_scaling = s;
    if (const json* t = jf::member(*rp, "rope_theta")) {
      const double v = f.at("rope_theta").number(*t);
      FSDP_CHECK(!theta || v == c.rope_theta,
                 "[hf] {}: rope_theta {} and rope_parameters.rope_theta {} disagree", where,
                 c.rope_theta, v);
      c.rope_theta = v;
    }
  }
  const bool qwen2 = model_type == "qwen2", qwen3 = model_type == "qwen3";
  c.kv_heads = jf::member(j, "num_key_value_heads") ? num("num_key_value_heads") : c.heads;
  FSDP_CHECK(c.kv_heads > 0 && c.heads % c.kv_heads == 0,
             "[hf] {}: num_attention_heads {} is not a multiple of num_key_value_heads {}", where,
             c.heads, c.kv_heads);
  if (jf::member(j, "head_dim")) c.head_dim = num("head_dim");
  // Llama's and Qwen3's attention_bias is on q, k, v and o; Qwen2's biases are on q, k and v
  // only, always. Qwen3 norms each head of q and k.
  FSDP_CHECK(!opt_bool("attention_bias", false),
             "[hf] {}: attention_bias true (a bias on o_proj too) is not supported", where);
  FSDP_CHECK(!opt_bool("mlp_bias", false), "[hf] {}: mlp_bias true is not supported", where);
  FSDP_CHECK(!(qwen2 || qwen3) || !opt_bool("use_sliding_window", false),
             "[hf] {}: use_sliding_window true (sliding-window attention) is not supported", where);
  c.qkv_bias = qwen2;
  c.qk_norm = qwen3;
  const json* act = jf::member(j, "hidden_act");
  const std::string hidden_act = act ? field("hidden_act").string(*act) : "silu";
  FSDP_CHECK(hidden_act == "silu", "[hf] {}: hidden_act '{}' is not supported; expected silu",
             where, hidden_act);
  // transformers' default for these classes: untied.
  c.tie_embeddings = opt_bool("tie_word_embeddings", false);
  c.validate();
  return c;
}

json hf_config(const nn::TransformerConfig& c, const ModelSpec& spec) {
  json j = {{"architectures", {spec.hf_class}},
            {"model_type", spec.hf_model_type},
            {"hidden_size", c.dim},
            {"intermediate_size", c.resolved_ffn_hidden()},
            {"num_attention_heads", c.heads},
            {"num_key_value_heads", c.resolved_kv_heads()},
            {"head_dim", c.resolved_head_dim()},
            {"num_hidden_layers", c.layers},
            {"vocab_size", c.vocab},
            {"max_position_embeddings", c.seq},
            {"rms_norm_eps", c.norm_eps.value_or(1.1920928955078125e-07)},
            {"rope_theta", c.rope_theta},
            {"rope_parameters", {{"rope_theta", c.rope_theta}, {"rope_type", "default"}}},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", c.tie_embeddings},
            {"attention_bias", false}};
  if (const ops::RopeScaling& s = c.rope_scaling; s.enabled()) {
    const double ctx = s.original_context;
    json scaling = {{"rope_type", "llama3"},
                    {"factor", s.factor},
                    {"low_freq_factor", s.low_freq_factor},
                    {"high_freq_factor", s.high_freq_factor},
                    {"original_max_position_embeddings",
                     ctx == std::floor(ctx) && ctx < 9e15 ? json(int64_t(ctx)) : json(ctx)}};
    j["rope_scaling"] = scaling;  // transformers 4
    scaling["rope_theta"] = c.rope_theta;
    j["rope_parameters"] = scaling;  // transformers 5
  }
  return j;
}

double read_router_aux_coef(const json& j, const std::string& where) {
  namespace jf = json_fields;
  const json* coef = jf::member(j, "router_aux_loss_coef");
  const double aux = coef ? jf::Field{"[hf]", where, "router_aux_loss_coef"}.number(*coef) : 0.001;
  const json* out = jf::member(j, "output_router_logits");
  return out && jf::Field{"[hf]", where, "output_router_logits"}.boolean(*out) ? aux : 0.0;
}

void write_router_aux_coef(const nn::TransformerConfig& c, json& j) {
  j["router_aux_loss_coef"] = c.moe.aux_coef > 0 ? c.moe.aux_coef : 0.001;
  j["output_router_logits"] = c.moe.aux_coef > 0;
}

void check_no_rope_scaling_in_gguf(const nn::TransformerConfig& c, std::string_view arch) {
  FSDP_CHECK(!c.rope_scaling.enabled(),
             "[gguf] llama.cpp's {} takes no Llama 3 rope scaling (rope_freqs)", arch);
}

// A mixture of experts in a GGUF of llama.cpp's `arch`, as its loader reads one: llama's with
// expert_count (Mixtral: the top k of the logits, softmax over the k, which is llama.cpp's softmax
// then the top k renormalized) or qwen3moe (softmax, the top k renormalized); an MoE in every
// block, the experts' width expert_feed_forward_length (qwen3moe) or feed_forward_length.
namespace {
void read_gguf_experts(const GgufHeader& f, const std::string& arch, nn::TransformerConfig& c) {
  const std::string a = arch + ".";
  const int64_t experts = f.get_int(a + "expert_count", 0);
  if (arch != "llama" && arch != "qwen3moe") {
    FSDP_CHECK(experts == 0, "[gguf] {}: {}expert_count {} in a {} file; llama.cpp's {} has no "
               "experts (a Qwen3-MoE is qwen3moe)", f.path(), a, experts, arch, arch);
    return;
  }
  FSDP_CHECK(experts > 0 || arch == "llama",
             "[gguf] {}: qwen3moe.expert_count is {}; expected the number of experts (> 0)",
             f.path(), experts);
  if (experts == 0) return;
  nn::MoEConfig& m = c.moe;
  m.experts = experts;
  m.top_k = f.get_int(a + "expert_used_count");
  m.hidden = arch == "qwen3moe" ? f.get_int(a + "expert_feed_forward_length") : c.ffn_hidden;
  m.router = arch == "llama" ? nn::RouterKind::topk_softmax : nn::RouterKind::softmax_topk;
  m.norm_topk_prob = arch == "qwen3moe";
  FSDP_CHECK(m.top_k > 0 && m.top_k <= m.experts && m.hidden > 0,
             "[gguf] {}: {}expert_used_count {} of expert_count {} experts of width {}: expected "
             "1 to {} experts used and a positive width",
             f.path(), a, m.top_k, m.experts, m.hidden, m.experts);
}
}  // namespace

// A GGUF file of llama.cpp's architecture `arch` (llama, qwen2, qwen3: its <arch>.* keys, in the
// terms of Hugging Face's LlamaConfig): GQA, a head dim of its own (attention.key_length), the
// head tied when output.weight is absent, Llama 3's scaling from rope_freqs.weight (llama.cpp's
// form of it), a mixture of experts (read_gguf_experts); a rope over part of the head and another
// rope scaling type refused by name.
nn::TransformerConfig read_gguf_keys(const GgufHeader& f, const std::string& arch) {
  const std::string& path = f.path();
  const std::string a = arch + ".";
  nn::TransformerConfig c;
  c.arch = nn::Arch::decoder;
  c.dim = f.get_int(a + "embedding_length");
  c.layers = f.get_int(a + "block_count");
  c.heads = f.get_int(a + "attention.head_count");
  c.kv_heads = f.get_int(a + "attention.head_count_kv", c.heads);
  c.ffn_hidden = f.get_int(a + "feed_forward_length");
  if (const int64_t context = f.get_int(a + "context_length", 0); context > 0) c.seq = context;
  c.rope_theta = f.get_float(a + "rope.freq_base", 10000.0);
  c.norm_eps = f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5);
  const int64_t head_dim = f.get_int(a + "attention.key_length",
                                     c.heads > 0 && c.dim % c.heads == 0 ? c.dim / c.heads : 0);
  FSDP_CHECK(
      c.dim > 0 && c.layers > 0 && c.heads > 0 && c.kv_heads > 0 && c.ffn_hidden > 0 &&
          head_dim > 0 && head_dim % 2 == 0 && c.heads % c.kv_heads == 0,
      "[gguf] {}: {} sizes dim {}, layers {}, heads {}, kv heads {}, head dim {}, ffn {} are "
      "not a model (heads need an even head size and must split into kv-head groups)",
      path, arch, c.dim, c.layers, c.heads, c.kv_heads, head_dim, c.ffn_hidden);
  if (head_dim * c.heads != c.dim) c.head_dim = head_dim;
  const int64_t value_length = f.get_int(a + "attention.value_length", head_dim);
  FSDP_CHECK(value_length == head_dim,
             "[gguf] {}: {}attention.value_length {} differs from the key length {}", path, a,
             value_length, head_dim);
  const int64_t rope_dim = f.get_int(a + "rope.dimension_count", head_dim);
  FSDP_CHECK(rope_dim == head_dim,
             "[gguf] {}: {}rope.dimension_count is {} but heads are {} wide; rope over part "
             "of a head is not supported",
             path, a, rope_dim, head_dim);
  const std::string scaling = f.get_string(a + "rope.scaling.type", "none");
  FSDP_CHECK(scaling == "none", "[gguf] {}: {}rope.scaling.type '{}' is not supported", path, a,
             scaling);
  const std::vector<int64_t> embd = f.tensor_ne("token_embd.weight");
  c.vocab = f.has(a + "vocab_size")          ? f.get_int(a + "vocab_size")
            : f.has("tokenizer.ggml.tokens") ? f.array_size("tokenizer.ggml.tokens")
            : embd.size() == 2               ? embd[1]
                                             : 0;
  FSDP_CHECK(embd == std::vector<int64_t>({c.dim, c.vocab}),
             "[gguf] {}: token_embd.weight has ne [{}] but dim {} and vocab {} need [{}, {}]", path,
             fmt::join(embd, ", "), c.dim, c.vocab, c.dim, c.vocab);
  c.tie_embeddings = !f.contains("output.weight");
  if (f.contains("rope_freqs.weight")) {
    FSDP_CHECK(arch == "llama",
               "[gguf] {}: rope_freqs.weight in a {} file: llama.cpp's {} takes no "
               "Llama 3 rope scaling",
               path, arch, arch);
    const std::vector<int64_t> ne = f.tensor_ne("rope_freqs.weight");
    FSDP_CHECK(ne == std::vector<int64_t>({head_dim / 2}),
               "[gguf] {}: rope_freqs.weight has ne [{}]; a head dim of {} needs [{}]", path,
               fmt::join(ne, ", "), head_dim, head_dim / 2);
    c.rope_scaling = ops::llama3_scaling_of_factors(f.read_f64("rope_freqs.weight"), c.rope_theta,
                                                    path + ": rope_freqs.weight");
  }
  // q/k/v biases are qwen2's (and always there), norms over q's and k's heads qwen3's.
  c.qkv_bias = f.contains("blk.0.attn_q.bias");
  FSDP_CHECK(c.qkv_bias == (arch == "qwen2"),
             "[gguf] {}: a {} file {} q/k/v biases (blk.0.attn_q.bias); {}", path, arch,
             c.qkv_bias ? "with" : "without",
             arch == "qwen2" ? "qwen2 has them" : "only qwen2 has them here");
  const bool qwen3 = arch == "qwen3" || arch == "qwen3moe";
  c.qk_norm = f.contains("blk.0.attn_q_norm.weight");
  FSDP_CHECK(c.qk_norm == qwen3, "[gguf] {}: a {} file {} q/k norms (blk.0.attn_q_norm.weight); {}",
             path, arch, c.qk_norm ? "with" : "without",
             qwen3 ? "qwen3 and qwen3moe have them" : "only qwen3 and qwen3moe have them here");
  read_gguf_experts(f, arch, c);
  c.validate();
  return c;
}

std::vector<std::pair<std::string, Tensor>> gguf_rope_freqs(const nn::TransformerConfig& config) {
  if (!config.rope_scaling.enabled()) return {};
  const std::vector<float> factors = ops::llama3_rope_factors(
      {config.rope_theta, config.rope_scaling}, config.resolved_head_dim());
  return {{"rope_freqs.weight", Tensor::from_vector(factors, {int64_t(factors.size())})}};
}

namespace {

bool matches(const nn::TransformerConfig& c) {
  return c.arch == nn::Arch::decoder && !c.qkv_bias && !c.qk_norm && !has_gemma_options(c) &&
         !c.moe.enabled();
}

nn::TransformerConfig read(const std::string& text, const std::string& where) {
  return read_hf_config(text, where, "llama");
}

std::string write(const nn::TransformerConfig& c) { return hf_config(c, spec).dump(); }

nn::TransformerConfig read_gguf(const GgufHeader& f) { return read_gguf_keys(f, "llama"); }

}  // namespace

// LlamaForCausalLM's names; llama.cpp's converter permuted q and k to neighbouring rotary pairs.
constexpr StateDictAdapter adapter = relative_adapter({.gguf_arch = "llama"});

const ModelSpec spec = {
    .name = "llama",
    .what =
        "Llama-family (SmolLM2, Llama 3.x): causal, RoPE (Llama 3's scaling too), SwiGLU, "
        "RMSNorm, grouped-query attention, tied or untied head",
    .arch = nn::Arch::decoder,
    .hf_model_type = "llama",
    .hf_class = "LlamaForCausalLM",
    .adapter = &adapter,
    .matches = matches,
    .read_hf_config = read,
    .write_hf_config = write,
    .read_gguf_config = read_gguf,
    .check_gguf = nullptr,
    .build = build,
    .parallelize = parallelize,
    .shape_keys = kShapeKeys,
    .gemm_shapes = gemm_shapes,
};

}  // namespace fsdp::models::llama
