// nn::TransformerConfig: presets, the config JSON both ways, validation and the counts read from
// the shape alone (parameters, FLOPs).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/ops/rope.h"
#include "src/core/json_read.h"
#include "src/nn/transformer_moe.h"

namespace fsdp::nn {

TransformerConfig TransformerConfig::preset(const std::string& name) {
  TransformerConfig c;
  if (name == "seed") return c;
  if (name == "tiny") {
    c.vocab = 4096;
    c.dim = 256;
    c.layers = 4;
    c.heads = 4;
    c.seq = 256;
    c.batch = 8;
    return c;
  }
  FSDP_FAIL("[model] unknown preset '{}'; expected seed or tiny", name);
}

std::string TransformerConfig::to_json() const {
  nlohmann::json j = {{"arch", arch_name(arch)},
                      {"vocab", vocab},
                      {"dim", dim},
                      {"layers", layers},
                      {"heads", heads},
                      {"ffn_hidden", resolved_ffn_hidden()},
                      {"seq", seq},
                      {"rope_theta", rope_theta}};
  if (norm_eps) j["norm_eps"] = *norm_eps;
  // Written only when they differ from the default: a config without them reads and compares
  // (checkpoint resume) exactly as before they existed.
  if (resolved_kv_heads() != heads) j["kv_heads"] = kv_heads;
  if (head_dim > 0 && head_dim * heads != dim) j["head_dim"] = head_dim;
  if (tie_embeddings) j["tie_embeddings"] = true;
  if (qkv_bias) j["qkv_bias"] = true;
  if (qk_norm) j["qk_norm"] = true;
  for (const auto& [key, on] : {std::pair<const char*, bool>{"norm_plus_one", norm_plus_one},
                                {"sandwich_norms", sandwich_norms},
                                {"geglu", geglu},
                                {"embed_scale", embed_scale}})
    if (on) j[key] = true;
  if (sliding_window > 0) {
    j["sliding_window"] = sliding_window;
    j["global_every"] = global_every;
  }
  if (rope_local_theta > 0) j["rope_local_theta"] = rope_local_theta;
  if (moe.enabled()) j["moe"] = moe_to_json(moe);
  if (lora.rank > 0)
    j["lora"] = {
        {"rank", lora.rank}, {"alpha", lora.alpha}, {"targets", lora_target_names(lora.targets)}};
  if (!family.empty()) {
    j["family"] = family;
    if (!family_options.empty()) j[family] = nlohmann::json::parse(family_options);
  }
  if (rope_scaling.enabled())
    j["rope_scaling"] = {{"type", ops::kRopeScalingType},
                         {"factor", rope_scaling.factor},
                         {"low_freq_factor", rope_scaling.low_freq_factor},
                         {"high_freq_factor", rope_scaling.high_freq_factor},
                         {"original_context", rope_scaling.original_context}};
  return j.dump();
}

TransformerConfig TransformerConfig::from_json(const std::string& text) {
  TransformerConfig c;
  try {
    const nlohmann::json j =
        json_read::parse(text, "(the model's config)", "[model]", json_read::kSmallMaxBytes);
    // Integer fields must be JSON integers: a float such as 3e48 would not fit (nlohmann's
    // conversion of it is undefined behaviour).
    auto integer = [&](const char* key, int64_t fallback, bool required) -> int64_t {
      if (!j.contains(key)) {
        FSDP_CHECK(!required, "[model] config has no '{}'", key);
        return fallback;
      }
      FSDP_CHECK(j[key].is_number_integer(), "[model] config field '{}' must be an integer, got {}",
                 key, json_read::brief(j[key]));
      return j[key].get<int64_t>();
    };
    c.arch = parse_arch(j.at("arch").get<std::string>());
    c.vocab = integer("vocab", 0, true);
    c.dim = integer("dim", 0, true);
    c.layers = integer("layers", 0, true);
    c.heads = integer("heads", 0, true);
    c.ffn_hidden = integer("ffn_hidden", 0, true);
    c.seq = integer("seq", c.seq, false);
    c.rope_theta = j.value("rope_theta", c.rope_theta);
    if (j.contains("norm_eps")) c.norm_eps = j.at("norm_eps").get<double>();
    c.kv_heads = integer("kv_heads", 0, false);
    c.head_dim = integer("head_dim", 0, false);
    auto boolean = [&](const char* key) {
      if (!j.contains(key)) return false;
      FSDP_CHECK(j[key].is_boolean(), "[model] config field '{}' must be true or false, got {}",
                 key, json_read::brief(j[key]));
      return j[key].get<bool>();
    };
    c.tie_embeddings = boolean("tie_embeddings");
    c.qkv_bias = boolean("qkv_bias");
    c.qk_norm = boolean("qk_norm");
    c.norm_plus_one = boolean("norm_plus_one");
    c.sandwich_norms = boolean("sandwich_norms");
    c.geglu = boolean("geglu");
    c.embed_scale = boolean("embed_scale");
    c.sliding_window = integer("sliding_window", 0, false);
    c.global_every = integer("global_every", 0, false);
    if (j.contains("rope_local_theta")) {
      FSDP_CHECK(j["rope_local_theta"].is_number(),
                 "[model] config field 'rope_local_theta' must be a number, got {}",
                 json_read::brief(j["rope_local_theta"]));
      c.rope_local_theta = j["rope_local_theta"].get<double>();
    }
    if (j.contains("lora")) {
      const nlohmann::json& l = j["lora"];
      FSDP_CHECK(l.is_object() && l.contains("rank") && l["rank"].is_number_integer() &&
                     l.contains("alpha") && l["alpha"].is_number() && l.contains("targets") &&
                     l["targets"].is_string(),
                 "[model] config field 'lora' must be an object of an integer rank, a number "
                 "alpha and a string of targets, got {}",
                 json_read::brief(l));
      c.lora = {.rank = l["rank"].get<int64_t>(),
                .alpha = l["alpha"].get<double>(),
                .targets = parse_lora_targets(l["targets"].get<std::string>())};
    }
    if (j.contains("moe")) c.moe = moe_from_json(j["moe"]);
    if (j.contains("family")) {
      FSDP_CHECK(j["family"].is_string(), "[model] config field 'family' must be a string, got {}",
                 json_read::brief(j["family"]));
      c.family = j["family"].get<std::string>();
      FSDP_CHECK(is_family_name(c.family),
                 "[model] config field 'family' must be a family's name (a-z, 0-9, _), got '{}'",
                 json_read::printable(c.family, 80));
      if (j.contains(c.family)) {
        FSDP_CHECK(j[c.family].is_object(),
                   "[model] config field '{}' (the {} family's options) must be an object, got {}",
                   c.family, c.family, json_read::brief(j[c.family]));
        c.family_options = j[c.family].dump();
      }
    }
    if (j.contains("rope_scaling")) {
      const nlohmann::json& s = j["rope_scaling"];
      FSDP_CHECK(s.is_object() && s.value("type", "") == ops::kRopeScalingType,
                 "[model] config field 'rope_scaling' must be an object of type {}, got {}",
                 ops::kRopeScalingType, json_read::brief(s));
      auto number = [&](const char* key) {
        FSDP_CHECK(s.contains(key) && s[key].is_number(),
                   "[model] config field 'rope_scaling.{}' must be a number, got {}", key,
                   s.contains(key) ? json_read::brief(s[key]) : "nothing");
        return s[key].get<double>();
      };
      c.rope_scaling = {.factor = number("factor"),
                        .low_freq_factor = number("low_freq_factor"),
                        .high_freq_factor = number("high_freq_factor"),
                        .original_context = number("original_context")};
    }
  } catch (const nlohmann::json::exception& e) {
    FSDP_FAIL("[model] config {}: {}", json_read::printable(text, 200), e.what());
  }
  c.validate();
  return c;
}

bool is_family_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 &&
         std::all_of(name.begin(), name.end(), [](char ch) {
           return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
         });
}

int64_t TransformerConfig::resolved_ffn_hidden() const {
  if (ffn_hidden > 0) return ffn_hidden;
  if (arch == Arch::seed) return 4 * dim;
  const int64_t h = 2 * (4 * dim) / 3;  // decoder: 2/3 of 4d, rounded up to a multiple of 256
  return (h + 255) / 256 * 256;
}

void TransformerConfig::validate() const {
  const std::string decoder = arch_name(Arch::decoder);  // as users name it, in the messages
  FSDP_CHECK(vocab > 0, "[model] vocab must be positive, got {}", vocab);
  FSDP_CHECK(dim > 0, "[model] dim must be positive, got {}", dim);
  FSDP_CHECK(layers > 0, "[model] layers must be positive, got {}", layers);
  FSDP_CHECK(heads > 0, "[model] heads must be positive, got {}", heads);
  FSDP_CHECK(kv_heads >= 0, "[model] kv_heads must be >= 0 (0 = heads), got {}", kv_heads);
  FSDP_CHECK(head_dim >= 0, "[model] head_dim must be >= 0 (0 = dim / heads), got {}", head_dim);
  FSDP_CHECK(head_dim > 0 || dim % heads == 0,
             "[model] dim {} is not divisible by heads {} (state head_dim to decouple them)", dim,
             heads);
  FSDP_CHECK(heads % resolved_kv_heads() == 0,
             "[model] heads {} is not divisible by kv_heads {}: each kv head serves a whole "
             "group of query heads",
             heads, resolved_kv_heads());
  if (arch == Arch::seed) {
    FSDP_CHECK(resolved_kv_heads() == heads,
               "[model] kv_heads {} is for arch {}; seed is nn.MultiheadAttention (kv_heads "
               "= heads {})",
               kv_heads, decoder, heads);
    FSDP_CHECK(head_dim == 0 || head_dim * heads == dim,
               "[model] head_dim {} is for arch {}; seed's head dim is dim / heads = {}",
               head_dim, decoder, dim / heads);
    FSDP_CHECK(!tie_embeddings,
               "[model] tie_embeddings is for arch {}; seed has an untied head", decoder);
    FSDP_CHECK(!qkv_bias,
               "[model] qkv_bias is for arch {}; seed's in-projection already has a bias",
               decoder);
    FSDP_CHECK(!qk_norm, "[model] qk_norm is for arch {}; seed has no norm on q and k", decoder);
    FSDP_CHECK(!rope_scaling.enabled(),
               "[model] rope_scaling is for arch {}; seed has no rotary embedding", decoder);
    FSDP_CHECK(!norm_plus_one && !sandwich_norms && !geglu && !embed_scale && sliding_window == 0 &&
                   rope_local_theta == 0,
               "[model] the options norm_plus_one, sandwich_norms, geglu, embed_scale, "
               "sliding_window and rope_local_theta are for arch {}",
               decoder);
  }
  FSDP_CHECK(seq > 0, "[model] seq must be positive, got {}", seq);
  FSDP_CHECK(batch > 0, "[model] batch must be positive, got {}", batch);
  FSDP_CHECK(ffn_hidden >= 0, "[model] ffn hidden size must be >= 0 (0 = default), got {}",
             ffn_hidden);
  // Sizes whose products (a weight, one step's logits) overflow 64 bits are refused here, not
  // later as a negative tensor size.
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"vocab", vocab},
                                {"dim", dim},
                                {"layers", layers},
                                {"heads", heads},
                                {"seq", seq},
                                {"batch", batch},
                                {"ffn_hidden", ffn_hidden},
                                {"kv_heads", kv_heads},
                                {"head_dim", head_dim}})
    FSDP_CHECK(v <= (int64_t(1) << 40), "[model] {} {} is over 2^40: its sizes would overflow",
               name, v);
  {
    int64_t p = 0, rows = 0;
    const int64_t f = resolved_ffn_hidden(), q = heads * resolved_head_dim();
    const bool overflow =
        __builtin_mul_overflow(batch, seq, &rows) || __builtin_mul_overflow(vocab, dim, &p) ||
        __builtin_mul_overflow(f, dim, &p) || __builtin_mul_overflow(q, dim, &p) ||
        __builtin_mul_overflow(rows, vocab, &p) || __builtin_mul_overflow(p, int64_t(8), &p) ||
        __builtin_mul_overflow(rows, std::max(f, q), &p) ||
        __builtin_mul_overflow(p, int64_t(8), &p);
    FSDP_CHECK(!overflow,
               "[model] vocab {}, dim {}, ffn hidden {}, batch {} x seq {}: the weights' or a "
               "step's sizes overflow 64 bits",
               vocab, dim, f, batch, seq);
  }
  if (arch == Arch::decoder) {
    FSDP_CHECK(resolved_head_dim() % 2 == 0,
               "[model] the rotary embedding needs an even head dim, got {}{}",
               resolved_head_dim(),
               head_dim > 0 ? std::string(" (head_dim)")
                            : fmt::format(" (dim {} / heads {})", dim, heads));
    FSDP_CHECK(rope_theta > 0, "[model] rope theta must be positive, got {}", rope_theta);
    ops::check_rope_scaling(rope_scaling, "[model]");
    FSDP_CHECK(sliding_window >= 0 && global_every >= 0,
               "[model] sliding_window {} and global_every {} must be >= 0", sliding_window,
               global_every);
    FSDP_CHECK(sliding_window > 0 || global_every == 0,
               "[model] global_every {} needs a sliding_window", global_every);
    FSDP_CHECK(rope_local_theta >= 0 && std::isfinite(rope_local_theta),
               "[model] rope_local_theta {} must be >= 0 (0: rope_theta)", rope_local_theta);
  }
  if (norm_eps) FSDP_CHECK(*norm_eps >= 0, "[model] norm eps must be >= 0, got {}", *norm_eps);
  FSDP_CHECK(family.empty() || is_family_name(family),
             "[model] family must be a family's name (a-z, 0-9, _), got '{}'", family);
  FSDP_CHECK(!family.empty() || family_options.empty(),
             "[model] family options {} without a family", family_options);
  moe.validate(layers);
  if (moe.enabled()) {
    FSDP_CHECK(arch == Arch::decoder, "[model] moe is for arch {}; seed has no SwiGLU FFN",
               decoder);
    FSDP_CHECK(!geglu, "[model] moe's experts are SwiGLU; geglu is a dense FFN's gate");
    FSDP_CHECK(!lora.on(LoraTarget::gate) && !lora.on(LoraTarget::up) &&
                   !lora.on(LoraTarget::down),
               "[model] LoRA targets gate, up and down are not supported with moe: a mixture of "
               "experts' experts and router stay frozen (no adapters on them), LoRA adapts its "
               "attention (q, k, v, o); got targets '{}'",
               lora_target_names(lora.targets));
  }
  if (lora.rank != 0 || lora.targets != 0) {
    FSDP_CHECK(lora.rank > 0 && lora.rank <= (int64_t(1) << 20) && lora.alpha > 0 &&
                   std::isfinite(lora.alpha) && lora.targets != 0,
               "[model] LoRA needs a rank in [1, 2^20], a positive alpha and at least one "
               "target; got rank {}, alpha {}, targets '{}'",
               lora.rank, lora.alpha, lora_target_names(lora.targets));
    FSDP_CHECK(arch == Arch::decoder || !lora.on(LoraTarget::gate),
               "[model] LoRA target gate: arch seed's FFN has no gate projection");
  }
}

int64_t TransformerConfig::matmul_params() const {
  const int64_t h = resolved_ffn_hidden();
  const int64_t ffn = (arch == Arch::seed ? 2 : 3) * dim * h;
  const int64_t hd = resolved_head_dim(), q = heads * hd, kv = resolved_kv_heads() * hd;
  const int64_t attn = dim * (q + 2 * kv) + q * dim;  // q, k, v, o; biases are not matmul work
  const int64_t sparse = moe.sparse_layers(layers);   // the router and top_k experts
  return layers * attn + (layers - sparse) * ffn +
         sparse * (moe.experts * dim + 3 * moe.top_k * moe.hidden * dim) +
         vocab * dim;  // the head, tied or not
}

int64_t TransformerConfig::active_parameters() const {
  const int64_t idle = moe.sparse_layers(layers) * 3 * (moe.experts - moe.top_k) * moe.hidden * dim;
  return num_parameters() - idle;
}

int64_t TransformerConfig::num_parameters() const {
  // In long double: a crafted config (2^40 layers of 2^20 wide) saturates, never wraps.
  using LD = long double;
  const LD d = LD(dim), h = LD(resolved_ffn_hidden()), hd = LD(resolved_head_dim());
  const LD q = LD(heads) * hd, kv = LD(resolved_kv_heads()) * hd;
  LD block = 2 * d;  // norm1, norm2
  if (arch == Arch::seed) {
    block += 3 * d * d + 3 * d + d * d + d + 2 * d * h;  // in_proj (+bias), out_proj (+bias), ffn
  } else {
    block += d * (q + 2 * kv) + q * d;
    if (qkv_bias) block += q + 2 * kv;
    if (qk_norm) block += 2 * hd;
    if (sandwich_norms) block += 2 * d;
  }
  const LD sparse = LD(moe.sparse_layers(layers));  // FFNs: dense, or a router and experts
  if (arch == Arch::decoder) block += 3 * d * h;
  LD n = LD(vocab) * d + LD(layers) * block - sparse * 3 * d * h +
         sparse * (LD(moe.experts) * d + 3 * LD(moe.experts) * LD(moe.hidden) * d);
  if (arch == Arch::decoder) n += d;            // final norm
  if (!tie_embeddings) n += d * LD(vocab);    // head
  n += LD(lora_parameters());                 // validated: small beside the blocks
  return n >= LD(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                      : int64_t(n);
}

int64_t TransformerConfig::lora_parameters() const {
  if (!lora.enabled()) return 0;
  const int64_t d = dim, h = resolved_ffn_hidden(), hd = resolved_head_dim();
  const int64_t q = heads * hd, kv = resolved_kv_heads() * hd, r = lora.rank;
  int64_t block = 0;
  int64_t parts = 0, rows = 0;  // the in-projection's packed pair
  for (const auto& [t, n] :
       {std::pair<LoraTarget, int64_t>{LoraTarget::q, q}, {LoraTarget::k, kv}, {LoraTarget::v, kv}})
    if (lora.on(t)) {
      ++parts;
      rows += n;
    }
  block += parts * r * d + rows * r;
  if (lora.on(LoraTarget::o)) block += r * q + d * r;
  for (LoraTarget t : {LoraTarget::gate, LoraTarget::up})
    if (lora.on(t)) block += r * d + h * r;
  if (lora.on(LoraTarget::down)) block += r * h + d * r;
  return layers * block;
}

bool TransformerConfig::layer_global(int64_t i) const {
  return sliding_window == 0 || (global_every > 0 && (i + 1) % global_every == 0);
}

int64_t TransformerConfig::layer_window(int64_t i) const {
  return layer_global(i) ? 0 : sliding_window;
}

double TransformerConfig::flops_per_token() const {
  double keys = 0;  // the keys each query's scores and weighted sum run over, summed over layers
  for (int64_t i = 0; i < layers; ++i)
    keys += double(layer_window(i) > 0 ? std::min(layer_window(i), seq) : seq);
  const double attention = 12.0 * double(heads * resolved_head_dim()) * keys;
  if (lora.enabled())  // frozen weights: forward and input gradient only
    return 4.0 * double(matmul_params()) + 6.0 * double(lora_parameters()) + attention;
  return 6.0 * double(matmul_params()) + attention;
}

}  // namespace fsdp::nn
