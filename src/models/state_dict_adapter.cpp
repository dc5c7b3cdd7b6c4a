// The renaming of a family's StateDictAdapter (fsdp/models/state_dict_adapter.h) over its rows.
#include "fsdp/models/state_dict_adapter.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdp::models {

namespace {

constexpr std::array<std::string_view, 3> kBlockPrefix = {"layers.", "model.layers.", "blk."};

size_t at(Naming n) { return size_t(n); }
std::string_view in(const NameRow& r, Naming n) {
  const std::array<std::string_view, 3> names = {r.ours, r.hf, r.gguf};
  return names[at(n)];
}

// "layers.12.norm1.weight" -> {"12", "norm1.weight"} in naming n.
std::optional<std::array<std::string, 2>> split_block(const std::string& name, Naming n) {
  const std::string_view prefix = kBlockPrefix[at(n)];
  if (!name.starts_with(prefix)) return std::nullopt;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return std::nullopt;
  std::string layer = name.substr(prefix.size(), dot - prefix.size());
  if (!std::all_of(layer.begin(), layer.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::array<std::string, 2>{std::move(layer), name.substr(dot + 1)};
}

}  // namespace

std::string StateDictAdapter::rename(const std::string& name, Naming from, Naming to) const {
  for (const NameRow& r : top)
    if (name == in(r, from)) return std::string(in(r, to));
  const auto parts = split_block(name, from);
  if (!parts) return "";
  auto find = [&](std::span<const NameRow> rows) -> std::optional<std::string> {
    for (const NameRow& r : rows) {
      if (in(r, from).empty() || (*parts)[1] != in(r, from)) continue;
      if (in(r, to).empty()) return "";
      return std::string(kBlockPrefix[at(to)]) + (*parts)[0] + "." + std::string(in(r, to));
    }
    return std::nullopt;
  };
  if (auto n = find(own_block)) return *n;
  if (auto n = find(block)) return *n;
  return find(qkv).value_or("");
}

std::array<std::string, 3> StateDictAdapter::in_proj_names(const std::string& ours,
                                                           Naming to) const {
  const auto parts = split_block(ours, Naming::ours);
  const size_t first = is_in_proj_bias(ours) ? 3 : 0;
  const std::string block =
      parts ? std::string(kBlockPrefix[at(to)]) + (*parts)[0] + "." : std::string();
  std::array<std::string, 3> out;
  for (size_t i = 0; i < 3; ++i)
    out[i] = to == Naming::ours ? "" : block + std::string(in(qkv[first + i], to));
  return out;
}

std::vector<std::string> StateDictAdapter::stacked_names(const std::string& ours, Naming to,
                                                         int64_t count) const {
  const auto parts = split_block(ours, Naming::ours);
  if (!parts || to == Naming::ours) return {};
  for (const NameRow& r : stacked) {
    if ((*parts)[1] != r.ours) continue;
    const std::string_view pattern = in(r, to);
    const size_t hole = pattern.find("{}");
    if (pattern.empty() || hole == std::string_view::npos) return {};
    const std::string block = std::string(kBlockPrefix[at(to)]) + (*parts)[0] + ".";
    std::vector<std::string> out;
    for (int64_t e = 0; e < count; ++e)
      out.push_back(block + std::string(pattern.substr(0, hole)) + std::to_string(e) +
                    std::string(pattern.substr(hole + 2)));
    return out;
  }
  return {};
}

bool StateDictAdapter::spells_spm_by_id(std::string_view arch) const {
  return gguf_spm_by_id &&
         (arch == gguf_arch || std::find(gguf_spm_by_id_arches.begin(),
                                         gguf_spm_by_id_arches.end(),
                                         arch) != gguf_spm_by_id_arches.end());
}

}  // namespace fsdp::models
