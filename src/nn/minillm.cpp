// MiniLLM assembly, presets and validation.
#include "fsdp/nn/minillm.h"

#include <cstddef>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

namespace fsdp::nn {

Arch parse_arch(const std::string& s) {
  if (s == "seed") return Arch::seed;
  if (s == "llama") return Arch::llama;
  FSDP_FAIL("[MiniLLM] unknown arch '{}'; expected seed or llama", s);
}

std::string arch_name(Arch a) { return a == Arch::seed ? "seed" : "llama"; }

MiniLLMConfig MiniLLMConfig::preset(const std::string& name) {
  MiniLLMConfig c;
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
  FSDP_FAIL("[MiniLLM] unknown preset '{}'; expected seed or tiny", name);
}

std::string MiniLLMConfig::to_json() const {
  nlohmann::json j = {{"arch", arch_name(arch)},
                      {"vocab", vocab},
                      {"dim", dim},
                      {"layers", layers},
                      {"heads", heads},
                      {"ffn_hidden", resolved_ffn_hidden()},
                      {"seq", seq},
                      {"rope_theta", rope_theta}};
  if (norm_eps) j["norm_eps"] = *norm_eps;
  return j.dump();
}

MiniLLMConfig MiniLLMConfig::from_json(const std::string& text) {
  MiniLLMConfig c;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    // Integer fields must be JSON integers: a float such as 3e48 would not fit (nlohmann's
    // conversion of it is undefined behaviour).
    auto integer = [&](const char* key, int64_t fallback, bool required) -> int64_t {
      if (!j.contains(key)) {
        FSDP_CHECK(!required, "[MiniLLM] config has no '{}'", key);
        return fallback;
      }
      FSDP_CHECK(j[key].is_number_integer(),
                 "[MiniLLM] config field '{}' must be an integer, got {}", key, j[key].dump());
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
  } catch (const nlohmann::json::exception& e) {
    FSDP_FAIL("[MiniLLM] config {}: {}", text.size() > 200 ? text.substr(0, 200) + "..." : text,
              e.what());
  }
  c.validate();
  return c;
}

int64_t MiniLLMConfig::resolved_ffn_hidden() const {
  if (ffn_hidden > 0) return ffn_hidden;
  if (arch == Arch::seed) return 4 * dim;
  const int64_t h = 2 * (4 * dim) / 3;  // llama: 2/3 of 4d, rounded up to a multiple of 256
  return (h + 255) / 256 * 256;
}

void MiniLLMConfig::validate() const {
  FSDP_CHECK(vocab > 0, "[MiniLLM] vocab must be positive, got {}", vocab);
  FSDP_CHECK(dim > 0, "[MiniLLM] dim must be positive, got {}", dim);
  FSDP_CHECK(layers > 0, "[MiniLLM] layers must be positive, got {}", layers);
  FSDP_CHECK(heads > 0, "[MiniLLM] heads must be positive, got {}", heads);
  FSDP_CHECK(dim % heads == 0, "[MiniLLM] dim {} is not divisible by heads {}", dim, heads);
  FSDP_CHECK(seq > 0, "[MiniLLM] seq must be positive, got {}", seq);
  FSDP_CHECK(batch > 0, "[MiniLLM] batch must be positive, got {}", batch);
  FSDP_CHECK(ffn_hidden >= 0, "[MiniLLM] ffn hidden size must be >= 0 (0 = default), got {}",
             ffn_hidden);
  if (arch == Arch::llama) {
    FSDP_CHECK((dim / heads) % 2 == 0,
               "[MiniLLM] llama's rotary embedding needs an even head dim, got {} / {} = {}", dim,
               heads, dim / heads);
    FSDP_CHECK(rope_theta > 0, "[MiniLLM] rope theta must be positive, got {}", rope_theta);
  }
  if (norm_eps) FSDP_CHECK(*norm_eps >= 0, "[MiniLLM] norm eps must be >= 0, got {}", *norm_eps);
}

int64_t MiniLLMConfig::matmul_params() const {
  const int64_t h = resolved_ffn_hidden();
  const int64_t ffn = (arch == Arch::seed ? 2 : 3) * dim * h;
  const int64_t attn = 4 * dim * dim;  // biases are not matmul work
  return layers * (attn + ffn) + vocab * dim;
}

double MiniLLMConfig::flops_per_token() const {
  return 6.0 * double(matmul_params()) + 12.0 * double(layers) * double(dim) * double(seq);
}

MiniLLM::MiniLLM(const MiniLLMConfig& cfg) : Module("MiniLLM"), cfg_(cfg) {
  cfg.validate();
  AttentionOptions attn;
  FeedForward::Kind ffn_kind = FeedForward::Kind::silu_mlp;
  if (cfg.arch == Arch::llama) {
    attn = {.bias = false, .causal = true, .rope_theta = cfg.rope_theta, .xavier_in_proj = false};
    ffn_kind = FeedForward::Kind::swiglu;
  }
  embed_ = &register_module("embed", std::make_unique<Embedding>(cfg.vocab, cfg.dim));
  layers_ = &register_module("layers", std::make_unique<ModuleList>());
  for (int64_t i = 0; i < cfg.layers; ++i)
    layers_->append(std::make_unique<TransformerBlock>(
        cfg.dim, cfg.heads, cfg.resolved_ffn_hidden(), ffn_kind, attn, cfg.norm_eps));
  if (cfg.arch == Arch::llama)
    norm_ = &register_module("norm", std::make_unique<RMSNorm>(cfg.dim, cfg.norm_eps));
  head_ = &register_module("head", std::make_unique<Linear>(cfg.dim, cfg.vocab, false));
}

void MiniLLM::start_kv_cache(int64_t capacity) {
  FSDP_CHECK(cfg_.arch == Arch::llama,
             "[MiniLLM] a KV cache needs causal attention: arch llama, not {}",
             arch_name(cfg_.arch));
  for (size_t i = 0; i < layers_->size(); ++i)
    dynamic_cast<TransformerBlock&>((*layers_)[i]).attn().start_kv_cache(capacity);
}

void MiniLLM::stop_kv_cache() {
  for (size_t i = 0; i < layers_->size(); ++i)
    dynamic_cast<TransformerBlock&>((*layers_)[i]).attn().stop_kv_cache();
}

int64_t MiniLLM::kv_length() {
  return layers_->size() ? dynamic_cast<TransformerBlock&>((*layers_)[0]).attn().kv_length() : -1;
}

Tensor MiniLLM::forward_impl(const Tensor& tokens) {
  FSDP_CHECK(tokens.dim() == 2, "[MiniLLM] tokens must be [batch, seq], got {}",
             shape_str(tokens.shape()));
  Tensor x = layers_->forward(embed_->forward(tokens));
  if (norm_) x = norm_->forward(x);
  return head_->forward(x);
}

Tensor MiniLLM::backward_impl(const Tensor& dlogits) {
  Tensor dx = head_->backward(dlogits);
  if (norm_) dx = norm_->backward(dx);
  return embed_->backward(layers_->backward(dx));
}

}  // namespace fsdp::nn
