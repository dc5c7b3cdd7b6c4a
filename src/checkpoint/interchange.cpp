// Consolidation (a sharded checkpoint's full tensors, checked by the same manifest check as a
// resume) and Hugging Face's parameter names. The Hugging Face config and tokenizer files are in
// tokenizer_files.cpp, the GGUF writer in gguf_writer.cpp.
#include "fsdp/checkpoint/interchange.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/ops/ops.h"
#include "src/checkpoint/manifest.h"
#include "fsdp/models/spec.h"
#include "fsdp/models/state_dict_adapter.h"

namespace fsdp::checkpoint {

using json = nlohmann::json;
using models::is_in_proj;
using models::is_in_proj_bias;
using models::Naming;

std::array<std::pair<int64_t, int64_t>, 3> in_proj_rows(const nn::TransformerConfig& cfg) {
  const int64_t q = cfg.heads * cfg.resolved_head_dim(),
                kv = cfg.resolved_kv_heads() * cfg.resolved_head_dim();
  return {{{0, q}, {q, q + kv}, {q + kv, q + 2 * kv}}};
}

std::string hf_name(const models::StateDictAdapter& names, const std::string& ours) {
  if (is_in_proj(ours) || is_in_proj_bias(ours)) return "";
  const std::string hf = names.rename(ours, Naming::ours, Naming::hf);
  return hf.empty() ? ours : hf;
}

namespace {
// The frozen base of a LoRA checkpoint, into `model`'s own storage, as the run built it: in the
// run's --dtype (a bf16 base is rounded to bf16, as its shards were), from the --init-from model
// its config names (checked by content) or from the initialisation of the run's seed (checked
// against what the config says the base is).
nn::FlatParameters lora_base(const detail::Manifest& m, const std::string& ckpt_path,
                             nn::Transformer& model) {
  const json& run = m.meta.at("config");
  const std::string path = run.value("base", "");
  const std::string content = run.value("base_content", "");
  FSDP_CHECK(run.contains("seed") && run["seed"].is_number_unsigned() && run.contains("dtype") &&
                 run["dtype"].is_string() && !content.empty(),
             "[checkpoint] {}/metadata.json: a LoRA checkpoint's config needs its seed, dtype and "
             "base_content (what its frozen base is); they are missing or mistyped",
             ckpt_path);
  const uint64_t seed = run["seed"].get<uint64_t>();
  const DType dtype = parse_dtype(run["dtype"].get<std::string>());
  nn::FlatParameters flat = nn::materialize(model, dtype, seed);
  if (path.empty()) {
    const std::string want = fmt::format("initialised from seed {}", seed);
    FSDP_CHECK(content == want,
               "[checkpoint] {}/metadata.json names no base path, but its base is '{}', not '{}': "
               "the adapters would be applied to another model",
               ckpt_path, content, want);
    return flat;
  }
  std::string now;
  try {
    now = model_identity(path);
  } catch (const std::exception& e) {
    FSDP_FAIL("[checkpoint] {} holds LoRA adapters on the base {}, which cannot be read: {}",
              ckpt_path, path, e.what());
  }
  FSDP_CHECK(now == content,
             "[checkpoint] {} holds LoRA adapters trained on {} as it was ({}), but it is now {}: "
             "the adapters would be applied to another model",
             ckpt_path, path, content, now);
  load_pretrained(path).load_into(model);
  return flat;
}

NamedTensors consolidate_unchecked(const std::string& ckpt_path, nn::TransformerConfig* cfg_out,
                                   bool merge) {
  // The same checks as a resume's load (detail::read_manifest, detail::open_shard), in the same
  // words, before any tensor byte is read.
  const detail::Manifest m = detail::read_manifest(ckpt_path);
  nn::TransformerConfig cfg = nn::TransformerConfig::from_json(m.meta.at("config").dump());
  if (cfg_out) *cfg_out = cfg;
  std::vector<std::unique_ptr<SafetensorsIndex>> files;
  for (int s = 0; s < m.shards; ++s) files.push_back(detail::open_shard(m, s));
  // The config's model against the tensors listed (each checked against its shard's bytes by
  // open_shard), before the model is built: an edited layer count or width is refused here, not
  // allocated (3e6 layers took 7 GB before).
  long double listed = 0;
  for (const auto& [name, t] : m.tensors) listed += (long double)shape_numel(t.shape);
  const bool lora = cfg.lora.enabled();  // its checkpoints hold the adapters, not the base
  FSDP_CHECK(listed == (long double)(lora ? cfg.lora_parameters() : models::num_parameters(cfg)),
             "[checkpoint] {}/metadata.json: its config (layers {}, dim {}, vocab {}, ffn_hidden "
             "{}) makes a model of {} {}parameters but its tensors hold {:.0f}: the config and "
             "the tensors disagree (was metadata.json edited?)",
             ckpt_path, cfg.layers, cfg.dim, cfg.vocab, cfg.resolved_ffn_hidden(),
             lora ? cfg.lora_parameters() : models::num_parameters(cfg), lora ? "adapter " : "",
             double(listed));
  const std::unique_ptr<nn::Transformer> built = models::spec_to_train(cfg).build(cfg);
  nn::Transformer& model = *built;
  std::optional<nn::FlatParameters> base;  // LoRA: the base, built as the run built it
  if (lora) base = lora_base(m, ckpt_path, model);
  NamedTensors out;
  for (auto& [name, p] : model.named_parameters()) {
    if (base && !p->requires_grad) {
      out.emplace_back(name, p->data.clone());
      continue;
    }
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
    detail::check_finite(full, ckpt_path, name);  // an adapter before it is merged, too
    out.emplace_back(name, full);
  }
  if (lora && merge) {
    out = merge_lora(cfg, out);
    if (cfg_out) cfg_out->lora = {};
  }
  return out;
}
}  // namespace

NamedTensors merge_lora(const nn::TransformerConfig& cfg, const NamedTensors& with_adapters) {
  std::map<std::string, Tensor> by_name(with_adapters.begin(), with_adapters.end());
  const auto rows = in_proj_rows(cfg);
  const double scale = cfg.lora.scale();
  std::map<std::string, Tensor> merged;  // base weight name -> W + scale B A, in f64
  for (const auto& [name, a] : with_adapters) {
    if (!name.ends_with(".lora_A")) continue;
    const std::string owner = name.substr(0, name.size() - 7);
    const Tensor& b = by_name.at(owner + ".lora_B");
    const bool in_proj = owner.ends_with(".attn");
    const std::string weight = owner + (in_proj ? ".in_proj_weight" : ".weight");
    Tensor w = by_name.at(weight).to(DType::f64).contiguous();
    Tensor A = a.to(DType::f64).contiguous(), B = b.to(DType::f64).contiguous();
    const int64_t r = cfg.lora.rank;
    // The parts B's rows adapt: the in-projection's targeted q, k, v, or the whole weight.
    std::vector<std::pair<int64_t, int64_t>> parts;
    if (in_proj) {
      for (const auto& [t, i] : {std::pair<nn::LoraTarget, size_t>{nn::LoraTarget::q, 0},
                                 {nn::LoraTarget::k, 1},
                                 {nn::LoraTarget::v, 2}})
        if (cfg.lora.on(t)) parts.push_back(rows[i]);
    } else {
      parts.emplace_back(0, w.size(0));
    }
    int64_t b_row = 0;
    for (size_t j = 0; j < parts.size(); ++j) {
      const auto [begin, end] = parts[j];
      Tensor wj = w.narrow(0, begin, end - begin).contiguous();
      ops::gemm(B.narrow(0, b_row, end - begin).contiguous(), false,
                A.narrow(0, int64_t(j) * r, r).contiguous(), false, wj, scale, 1.0);
      w.narrow(0, begin, end - begin).copy_(wj);
      b_row += end - begin;
    }
    merged[weight] = w;
  }
  NamedTensors out;
  for (const auto& [name, t] : with_adapters) {
    if (nn::is_lora_parameter(name)) continue;
    const auto it = merged.find(name);
    // (A half-precision base's merged weights are f32: W + s B A rounded to bf16 again would lose
    // most of the adapter's change.)
    const DType dt = dtype_size(t.dtype()) == 2 ? DType::f32 : t.dtype();
    out.emplace_back(name, it == merged.end() ? t : it->second.to(dt));
  }
  return out;
}

namespace {
constexpr std::pair<nn::LoraTarget, const char*> kPeftModules[] = {
    {nn::LoraTarget::q, "q_proj"},       {nn::LoraTarget::k, "k_proj"},
    {nn::LoraTarget::v, "v_proj"},       {nn::LoraTarget::o, "o_proj"},
    {nn::LoraTarget::gate, "gate_proj"}, {nn::LoraTarget::up, "up_proj"},
    {nn::LoraTarget::down, "down_proj"}};
// "model.layers.0.self_attn.q_proj.weight" -> PEFT's "base_model.model.model.layers.0.self_attn.
// q_proj.lora_A.weight".
std::string peft_name(const std::string& hf_weight, const char* ab) {
  return "base_model.model." + hf_weight.substr(0, hf_weight.size() - 7) + "." + ab + ".weight";
}
}  // namespace

std::string lora_base_path(const std::string& ckpt_path) {
  try {
    return detail::read_manifest(ckpt_path).meta.at("config").value("base", "");
  } catch (const json::exception& e) {
    FSDP_FAIL("[checkpoint] {}/metadata.json does not hold a checkpoint's fields: {}", ckpt_path,
              e.what());
  }
}

NamedTensors to_peft(const nn::TransformerConfig& cfg, const NamedTensors& with_adapters) {
  FSDP_CHECK(cfg.lora.enabled(), "[export] a PEFT adapter is LoRA; this model has none");
  const models::StateDictAdapter& names = models::adapter_of(cfg, "[export] a PEFT adapter");
  std::map<std::string, Tensor> by_name(with_adapters.begin(), with_adapters.end());
  const auto rows = in_proj_rows(cfg);
  const int64_t r = cfg.lora.rank;
  NamedTensors out;
  for (const auto& [name, a] : with_adapters) {
    if (!name.ends_with(".lora_A")) continue;
    const std::string owner = name.substr(0, name.size() - 7);
    const Tensor& b = by_name.at(owner + ".lora_B");
    if (!owner.ends_with(".attn")) {
      const std::string hf = hf_name(names, owner + ".weight");
      out.emplace_back(peft_name(hf, "lora_A"), a);
      out.emplace_back(peft_name(hf, "lora_B"), b);
      continue;
    }
    // The packed pair: part j's rows of A, and its run of B's rows.
    const auto qkv = names.in_proj_names(owner + ".in_proj_weight", Naming::hf);
    int64_t j = 0, b_row = 0;
    for (size_t i = 0; i < 3; ++i) {
      if (!cfg.lora.on(kPeftModules[i].first)) continue;
      const int64_t n = rows[i].second - rows[i].first;
      out.emplace_back(peft_name(qkv[i], "lora_A"), a.narrow(0, j * r, r).contiguous());
      out.emplace_back(peft_name(qkv[i], "lora_B"), b.narrow(0, b_row, n).contiguous());
      ++j;
      b_row += n;
    }
  }
  return out;
}

std::string peft_adapter_config_json(const nn::TransformerConfig& cfg, const std::string& base) {
  json modules = json::array();
  for (const auto& [t, n] : kPeftModules)
    if (cfg.lora.on(t)) modules.push_back(n);
  return json{{"peft_type", "LORA"},
              {"task_type", "CAUSAL_LM"},
              {"base_model_name_or_path", base},
              {"r", cfg.lora.rank},
              {"lora_alpha", cfg.lora.alpha},
              {"lora_dropout", 0.0},
              {"target_modules", modules},
              {"bias", "none"},
              {"fan_in_fan_out", false},
              {"use_rslora", false},
              {"inference_mode", true},
              {"init_lora_weights", true},
              {"modules_to_save", nullptr}}
      .dump(2);
}

NamedTensors consolidate(const std::string& ckpt_path, nn::TransformerConfig* cfg_out, bool merge) {
  try {
    return consolidate_unchecked(ckpt_path, cfg_out, merge);
  } catch (const json::exception& e) {  // valid JSON of the wrong shape: name the file
    FSDP_FAIL("[checkpoint] {}/metadata.json does not hold a checkpoint's fields: {}", ckpt_path,
              e.what());
  }
}

NamedTensors to_hf(const nn::TransformerConfig& cfg, const NamedTensors& ours) {
  const models::StateDictAdapter& names = models::adapter_of(cfg, "[export] Hugging Face's names");
  NamedTensors out;
  const auto rows = in_proj_rows(cfg);
  for (auto& [name, t] : ours) {
    if (const auto experts = names.stacked_names(name, Naming::hf, cfg.moe.experts);
        !experts.empty()) {
      for (size_t e = 0; e < experts.size(); ++e) out.emplace_back(experts[e], t.select(int64_t(e)));
    } else if (is_in_proj(name) || is_in_proj_bias(name)) {
      const auto qkv = names.in_proj_names(name, Naming::hf);
      for (size_t i = 0; i < 3; ++i)
        out.emplace_back(qkv[i], t.slice(rows[i].first, rows[i].second));
    } else {
      out.emplace_back(hf_name(names, name), t);
    }
  }
  return out;
}

}  // namespace fsdp::checkpoint
