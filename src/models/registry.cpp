// The registry of model families (fsdp/models/spec.h): one line each in FSDP_MODEL_FAMILIES.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "fsdp/core/error.h"
#include "fsdp/models/spec.h"

// X(family): fsdp::models::<family>::spec, defined in src/models/<family>/spec.cpp. The order is
// the one messages list them in. Each line ends in a backslash, so a family adds one line.
#define FSDP_MODEL_FAMILIES(X) \
  X(seed)                      \
  X(llama)                     \
  X(qwen2)                     \
  X(qwen3)                     \
  X(gemma3)                    \
  X(mistral)                   \
  X(qwen3_moe)                 \
  X(mixtral)                   \
  X(olmo2)                     \
  /* the end of the list */

namespace fsdp::models {

#define FSDP_DECLARE_SPEC(family) \
  namespace family {              \
  extern const ModelSpec spec;    \
  }
FSDP_MODEL_FAMILIES(FSDP_DECLARE_SPEC)
#undef FSDP_DECLARE_SPEC

namespace {
#define FSDP_SPEC_ENTRY(family) &family::spec,
constexpr std::array kSpecs = {FSDP_MODEL_FAMILIES(FSDP_SPEC_ENTRY)};
#undef FSDP_SPEC_ENTRY
}  // namespace

std::span<const ModelSpec* const> model_specs() { return kSpecs; }

namespace {
// The families' names, ", "-joined (for messages).
std::string family_names() {
  std::string out;
  for (const ModelSpec* s : kSpecs) out += (out.empty() ? "" : ", ") + std::string(s->name);
  return out;
}

// The config's family by its "family" key, refused by name where there is none such or where the
// family does not hold the config's options.
const ModelSpec& named_family(const nn::TransformerConfig& c) {
  const ModelSpec* s = spec_named(c.family);
  FSDP_CHECK(s, "[models] the config names the family '{}', which is none of {}", c.family,
             family_names());
  FSDP_CHECK(s->matches(c),
             "[models] the config names the family {} ({}) but holds options that are not its "
             "(arch {}, qkv_bias {}, qk_norm {}, Gemma's norms {}, geglu {}, sliding_window {}, "
             "moe {}, its own options {})",
             s->name, s->what, nn::arch_name(c.arch), c.qkv_bias, c.qk_norm,
             c.norm_plus_one || c.sandwich_norms, c.geglu, c.sliding_window, c.moe.enabled(),
             c.family_options.empty() ? "none" : c.family_options);
  return *s;
}
}  // namespace

int64_t num_parameters(const nn::TransformerConfig& c) {
  const ModelSpec& s = spec_to_train(c);
  return s.num_parameters ? s.num_parameters(c) : c.num_parameters();
}

const ModelSpec& spec_of(const nn::TransformerConfig& c) {
  if (!c.family.empty()) return named_family(c);
  const ModelSpec* found = nullptr;
  for (const ModelSpec* s : kSpecs)
    if (s->matches(c)) {
      FSDP_CHECK(!found, "[models] a config is both {}'s and {}'s", found->name, s->name);
      found = s;
    }
  if (found) return *found;
  // No family holds it: say which options do not go together.
  FSDP_CHECK(!(c.norm_plus_one && c.sandwich_norms && c.geglu && c.embed_scale && c.qk_norm),
             "[models] a Gemma 3 model with q/k/v biases is no family's: gemma3 has none");
  FSDP_CHECK(!c.moe.enabled(),
             "[models] a mixture of experts with qk_norm {}, router {} and {} of {} blocks sparse "
             "is no family's: qwen3_moe has QK-norm and router softmax_topk, mixtral no QK-norm, "
             "router topk_softmax and every block sparse (neither has biases)",
             c.qk_norm, nn::router_kind_name(c.moe.router), c.moe.sparse_layers(c.layers),
             c.layers);
  FSDP_CHECK(!(c.qk_norm && c.qkv_bias),
             "[models] a model with q/k norms and q/k/v biases (no o_proj bias) is no family's: "
             "qwen3 has QK-norm and no biases, qwen2 biases and no QK-norm");
  FSDP_FAIL(
      "[models] a model with some of Gemma 3's options but not all (qk_norm {}, norm_plus_one "
      "{}, sandwich_norms {}, geglu {}, embed_scale {}, sliding_window {}) is no family's: gemma3 "
      "has all of the first five",
      c.qk_norm, c.norm_plus_one, c.sandwich_norms, c.geglu, c.embed_scale, c.sliding_window);
}

nn::TransformerConfig named_config(nn::TransformerConfig c) {
  // The seed's form is its family alone (no option of another's), and its name is the key under
  // which a run's config (fsdp-train's checkpoints) holds its random seed, where the config JSON
  // would look for the family's options: its configs stay unnamed, as before.
  if (!c.family.empty() || c.arch == nn::Arch::seed) return c;
  for (const ModelSpec* s : kSpecs)
    if (s->matches(c)) {  // spec_of's choice: one family at most holds a config
      c.family = s->name;
      return c;
    }
  return c;
}

const ModelSpec& spec_to_train(const nn::TransformerConfig& c) {
  if (!c.family.empty()) return named_family(c);
  for (const ModelSpec* s : kSpecs)
    if (s->matches(c)) return *s;
  const ModelSpec* form = spec_named(nn::arch_name(c.arch));
  FSDP_CHECK(form, "[models] no family is the {} form", nn::arch_name(c.arch));
  return *form;
}

const ModelSpec* spec_for_hf_model_type(std::string_view model_type) {
  for (const ModelSpec* s : kSpecs)
    if (!s->hf_model_type.empty() && s->hf_model_type == model_type) return s;
  return nullptr;
}

const ModelSpec* spec_for_gguf_arch(std::string_view arch) {
  for (const ModelSpec* s : kSpecs)
    if (s->adapter && !s->adapter->gguf_arch.empty() && s->adapter->gguf_arch == arch) return s;
  return nullptr;
}

const StateDictAdapter& adapter_of(const nn::TransformerConfig& config, std::string_view what) {
  const ModelSpec& s = spec_to_train(config);
  FSDP_CHECK(s.adapter,
             "{}: the {} family ({}) has only our own parameter names, no Hugging Face or "
             "llama.cpp ones",
             what, s.name, s.what);
  return *s.adapter;
}

std::string gguf_archs() {
  std::string out;
  for (const ModelSpec* s : kSpecs)
    if (s->read_gguf_config && s->adapter)
      out += (out.empty() ? "" : ", ") + std::string(s->adapter->gguf_arch);
  return out;
}

const ModelSpec* spec_named(std::string_view name) {
  for (const ModelSpec* s : kSpecs)
    if (s->name == name) return s;
  return nullptr;
}

std::string hf_model_types() {
  std::string out;
  for (const ModelSpec* s : kSpecs)
    if (!s->hf_model_type.empty())
      out += (out.empty() ? "" : ", ") + std::string(s->hf_model_type) + " (" +
             std::string(s->hf_class) + ")";
  return out;
}

}  // namespace fsdp::models

namespace fsdp::nn {

BlockFactory family_blocks(const TransformerConfig& config) {
  if (config.family.empty()) return default_block;
  const models::ModelSpec& spec = models::spec_of(config);
  return spec.block ? BlockFactory(spec.block) : BlockFactory(default_block);
}

}  // namespace fsdp::nn
