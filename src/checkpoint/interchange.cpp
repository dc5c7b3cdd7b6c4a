// Consolidation (a sharded checkpoint's full tensors, checked by the same manifest check as a
// resume) and Hugging Face's parameter names. The Hugging Face config and tokenizer files are in
// tokenizer_files.cpp, the GGUF writer in gguf_writer.cpp.
#include "fsdp/checkpoint/interchange.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "src/checkpoint/manifest.h"
#include "src/checkpoint/param_names.h"

namespace fsdp::checkpoint {

using json = nlohmann::json;
using detail::is_in_proj;
using detail::is_in_proj_bias;

std::array<std::pair<int64_t, int64_t>, 3> in_proj_rows(const nn::MiniLLMConfig& cfg) {
  const int64_t q = cfg.heads * cfg.resolved_head_dim(),
                kv = cfg.resolved_kv_heads() * cfg.resolved_head_dim();
  return {{{0, q}, {q, q + kv}, {q + kv, q + 2 * kv}}};
}

std::string hf_name(const std::string& ours, bool sandwich) {
  if (is_in_proj(ours) || is_in_proj_bias(ours)) return "";
  const std::string hf = detail::rename(ours, detail::Naming::ours, detail::Naming::hf, sandwich);
  return hf.empty() ? ours : hf;
}

namespace {
NamedTensors consolidate_unchecked(const std::string& ckpt_path, nn::MiniLLMConfig* cfg_out) {
  // The same checks as a resume's load (detail::read_manifest, detail::open_shard), in the same
  // words, before any tensor byte is read.
  const detail::Manifest m = detail::read_manifest(ckpt_path);
  nn::MiniLLMConfig cfg = nn::MiniLLMConfig::from_json(m.meta.at("config").dump());
  if (cfg_out) *cfg_out = cfg;
  std::vector<std::unique_ptr<SafetensorsIndex>> files;
  for (int s = 0; s < m.shards; ++s) files.push_back(detail::open_shard(m, s));
  // The config's model against the tensors listed (each checked against its shard's bytes by
  // open_shard), before the model is built: an edited layer count or width is refused here, not
  // allocated (3e6 layers took 7 GB before).
  long double listed = 0;
  for (const auto& [name, t] : m.tensors) listed += (long double)shape_numel(t.shape);
  FSDP_CHECK(listed == (long double)cfg.num_parameters(),
             "[checkpoint] {}/metadata.json: its config (layers {}, dim {}, vocab {}, ffn_hidden "
             "{}) makes a model of {} parameters but its tensors hold {:.0f}: the config and the "
             "tensors disagree (was metadata.json edited?)",
             ckpt_path, cfg.layers, cfg.dim, cfg.vocab, cfg.resolved_ffn_hidden(),
             cfg.num_parameters(), double(listed));
  nn::MiniLLM model(cfg);
  NamedTensors out;
  for (auto& [name, p] : model.named_parameters()) {
    const auto it = m.tensors.find(name);
    FSDP_CHECK(it != m.tensors.end(), "[checkpoint] {} has no tensor '{}'", ckpt_path, name);
    const detail::TensorEntry& t = it->second;
    FSDP_CHECK(t.shape == p->shape, "[checkpoint] {}: '{}' has shape {} but the model has {}",
               ckpt_path, name, shape_str(t.shape), shape_str(p->shape));
    Tensor full = Tensor::empty(p->shape, t.dtype);
    const int64_t row = p->shape[0] ? shape_numel(p->shape) / p->shape[0] : 0;
    Tensor flat = full.view({-1});
    for (int s = 0; s < m.shards; ++s) {
      const auto [b, len] = t.chunks[size_t(s)];
      if (len > 0)
        flat.slice(b * row, (b + len) * row)
            .copy_(files[size_t(s)]->read("param/" + name).reshape({-1}));
    }
    out.emplace_back(name, full);
  }
  return out;
}
}  // namespace

NamedTensors consolidate(const std::string& ckpt_path, nn::MiniLLMConfig* cfg_out) {
  try {
    return consolidate_unchecked(ckpt_path, cfg_out);
  } catch (const json::exception& e) {  // valid JSON of the wrong shape: name the file
    FSDP_FAIL("[checkpoint] {}/metadata.json does not hold a checkpoint's fields: {}", ckpt_path,
              e.what());
  }
}

NamedTensors to_hf_llama(const nn::MiniLLMConfig& cfg, const NamedTensors& ours) {
  FSDP_CHECK(cfg.arch == nn::Arch::llama,
             "[export] Hugging Face names are for the llama architecture, not {}",
             nn::arch_name(cfg.arch));
  NamedTensors out;
  const auto rows = in_proj_rows(cfg);
  for (auto& [name, t] : ours) {
    if (is_in_proj(name) || is_in_proj_bias(name)) {
      const auto names = detail::in_proj_names(name, detail::Naming::hf);
      for (size_t i = 0; i < 3; ++i)
        out.emplace_back(names[i], t.slice(rows[i].first, rows[i].second));
    } else {
      out.emplace_back(hf_name(name, cfg.sandwich_norms), t);
    }
  }
  return out;
}

}  // namespace fsdp::checkpoint
