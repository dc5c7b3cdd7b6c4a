// The name table of param_names.h.
#include "src/checkpoint/param_names.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace fsdp::checkpoint::detail {

namespace {

using Row = std::array<const char*, 3>;  // ours, Hugging Face, GGUF; "" where a naming has none

constexpr Row kTop[] = {
    {"embed.weight", "model.embed_tokens.weight", "token_embd.weight"},
    {"norm.weight", "model.norm.weight", "output_norm.weight"},
    {"head.weight", "lm_head.weight", "output.weight"},
};
// The names after a block's prefix: "layers.N.", "model.layers.N.", "blk.N.".
constexpr Row kBlock[] = {
    {"norm1.weight", "input_layernorm.weight", "attn_norm.weight"},
    {"attn.out_proj.weight", "self_attn.o_proj.weight", "attn_output.weight"},
    {"norm2.weight", "post_attention_layernorm.weight", "ffn_norm.weight"},
    {"ffn.w1.weight", "mlp.gate_proj.weight", "ffn_gate.weight"},
    {"ffn.w3.weight", "mlp.up_proj.weight", "ffn_up.weight"},
    {"ffn.w2.weight", "mlp.down_proj.weight", "ffn_down.weight"},
    {"attn.in_proj_weight", "", ""},
    {"attn.in_proj_bias", "", ""},
    {"", "self_attn.q_proj.weight", "attn_q.weight"},
    {"", "self_attn.k_proj.weight", "attn_k.weight"},
    {"", "self_attn.v_proj.weight", "attn_v.weight"},
    {"", "self_attn.q_proj.bias", "attn_q.bias"},
    {"", "self_attn.k_proj.bias", "attn_k.bias"},
    {"", "self_attn.v_proj.bias", "attn_v.bias"},
    {"attn.q_norm.weight", "self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"attn.k_norm.weight", "self_attn.k_norm.weight", "attn_k_norm.weight"},
};
// The q, k and v rows (weights, then biases), which in_proj_names reads by position.
constexpr size_t kQkvRows = 8;
static_assert(std::string_view(kBlock[kQkvRows][1]) == "self_attn.q_proj.weight" &&
              std::string_view(kBlock[kQkvRows + 5][2]) == "attn_v.bias");
// A sandwich block's (Gemma's) norms, looked up before kBlock (whose norm2 row they replace).
constexpr Row kSandwich[] = {
    {"norm2.weight", "pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_attn_norm.weight", "post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"post_ffn_norm.weight", "post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};
constexpr const char* kBlockPrefix[] = {"layers.", "model.layers.", "blk."};

size_t at(Naming n) { return size_t(n); }

// "layers.12.norm1.weight" -> {"12", "norm1.weight"} in naming n.
std::optional<std::array<std::string, 2>> split_block(const std::string& name, Naming n) {
  const std::string prefix = kBlockPrefix[at(n)];
  if (!name.starts_with(prefix)) return std::nullopt;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return std::nullopt;
  std::string layer = name.substr(prefix.size(), dot - prefix.size());
  if (!std::all_of(layer.begin(), layer.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::array<std::string, 2>{std::move(layer), name.substr(dot + 1)};
}

}  // namespace

std::string rename(const std::string& name, Naming from, Naming to, bool sandwich) {
  for (const Row& r : kTop)
    if (name == r[at(from)]) return r[at(to)];
  const auto parts = split_block(name, from);
  if (!parts) return "";
  auto in = [&](std::span<const Row> rows) -> std::optional<std::string> {
    for (const Row& r : rows) {
      if (*r[at(from)] == '\0' || (*parts)[1] != r[at(from)]) continue;
      if (*r[at(to)] == '\0') return "";
      return kBlockPrefix[at(to)] + (*parts)[0] + "." + r[at(to)];
    }
    return std::nullopt;
  };
  if (sandwich)
    if (auto n = in(kSandwich)) return *n;
  return in(kBlock).value_or("");
}

std::array<std::string, 3> in_proj_names(const std::string& ours, Naming to) {
  const auto parts = split_block(ours, Naming::ours);
  const bool bias = is_in_proj_bias(ours);
  const std::string block = parts ? kBlockPrefix[at(to)] + (*parts)[0] + "." : "";
  std::array<std::string, 3> out;
  for (size_t i = 0; i < 3; ++i) {
    const Row& r = kBlock[kQkvRows + (bias ? 3 : 0) + i];
    out[i] = to == Naming::ours ? "" : block + r[at(to)];
  }
  return out;
}

}  // namespace fsdp::checkpoint::detail
