// The model specs (fsdp/models/spec.h, src/models/<family>/): each family's own config is its and
// no other family's; its config.json, written and read back, is the same model; the registry
// finds a family by model_type and by name; a mix of options no family holds is refused by name
// for export (spec_of) and trains as its form's (spec_to_train). The families' numbers against
// transformers are families_ref_test's and gemma3_ref_test's (with torch).
#include <gtest/gtest.h>

#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/models/spec.h"
#include "fsdp/nn/transformer.h"
#include "test_util.h"

using namespace fsdp;
using test::error_of;

namespace {

nn::TransformerConfig llama_like() {
  nn::TransformerConfig c = nn::TransformerConfig::preset("tiny");
  c.arch = nn::Arch::llama;
  c.heads = 4, c.kv_heads = 2, c.head_dim = 32, c.layers = 4;
  c.norm_eps = 1e-6;
  return c;
}

// One config of each family, by its name.
std::vector<std::pair<std::string, nn::TransformerConfig>> one_of_each() {
  nn::TransformerConfig seed = nn::TransformerConfig::preset("tiny");
  nn::TransformerConfig llama = llama_like(), qwen2 = llama_like(), qwen3 = llama_like(),
                        gemma3 = llama_like(), mistral = llama_like();
  llama.rope_scaling = {
      .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_context = 64};
  qwen2.qkv_bias = true;
  qwen3.qk_norm = qwen3.tie_embeddings = true;
  gemma3.qk_norm = gemma3.norm_plus_one = gemma3.sandwich_norms = gemma3.geglu =
      gemma3.embed_scale = gemma3.tie_embeddings = true;
  gemma3.sliding_window = 32, gemma3.global_every = 2, gemma3.rope_local_theta = 10000;
  gemma3.rope_theta = 1e6;
  mistral.sliding_window = 16;
  return {{"seed", seed},   {"llama", llama},   {"qwen2", qwen2},
          {"qwen3", qwen3}, {"gemma3", gemma3}, {"mistral", mistral}};
}

}  // namespace

TEST(ModelSpec, EachFamilysConfigIsItsAndNoOtherFamilys) {
  const auto configs = one_of_each();
  ASSERT_EQ(configs.size(), models::model_specs().size());
  for (const auto& [name, c] : configs) {
    SCOPED_TRACE(name);
    c.validate();
    int matched = 0;
    for (const models::ModelSpec* s : models::model_specs()) matched += s->matches(c);
    EXPECT_EQ(matched, 1);
    EXPECT_EQ(models::spec_of(c).name, name);
    EXPECT_EQ(&models::spec_to_train(c), &models::spec_of(c));
    const models::ModelSpec* named = models::spec_named(name);
    ASSERT_NE(named, nullptr);
    EXPECT_EQ(named, &models::spec_of(c));
    if (!named->hf_model_type.empty())
      EXPECT_EQ(models::spec_for_hf_model_type(named->hf_model_type), named);
  }
  EXPECT_EQ(models::spec_for_hf_model_type("phi3"), nullptr);
  EXPECT_EQ(models::spec_for_hf_model_type(""), nullptr);
  EXPECT_EQ(models::spec_named("gpt2"), nullptr);
  // GGUF: the families llama.cpp has an architecture for, and those whose files are read.
  EXPECT_EQ(models::spec_for_gguf_arch("llama"), models::spec_named("llama"));
  EXPECT_EQ(models::spec_for_gguf_arch("gemma3"), models::spec_named("gemma3"));
  EXPECT_EQ(models::spec_for_gguf_arch("qwen3"), models::spec_named("qwen3"));
  EXPECT_EQ(models::spec_for_gguf_arch("mistral"), nullptr);  // llama.cpp converts it to llama
  EXPECT_NE(models::spec_named("llama")->read_gguf_config, nullptr);
  EXPECT_NE(models::spec_named("gemma3")->read_gguf_config, nullptr);
  EXPECT_NE(models::spec_named("qwen2")->read_gguf_config, nullptr);
  EXPECT_NE(models::spec_named("qwen3")->read_gguf_config, nullptr);
}

// config.json both ways: the family's writer, then its reader, give back the same model (its
// JSON, every shape key and option), and the file names the family's class.
TEST(ModelSpec, ConfigJsonWrittenAndReadBackIsTheSameModel) {
  for (const auto& [name, c] : one_of_each()) {
    SCOPED_TRACE(name);
    const models::ModelSpec& s = models::spec_of(c);
    if (s.hf_class.empty()) {
      EXPECT_EQ(s.write_hf_config, nullptr);
      EXPECT_EQ(s.read_hf_config, nullptr);
      continue;
    }
    const std::string text = s.write_hf_config(c);
    const nlohmann::json j = nlohmann::json::parse(text);
    EXPECT_EQ(j.at("architectures").at(0), s.hf_class);
    EXPECT_EQ(j.at("model_type"), s.hf_model_type);
    const nn::TransformerConfig back = s.read_hf_config(text, name + "/config.json");
    EXPECT_EQ(back.to_json(), c.to_json());
    EXPECT_EQ(back.sliding_window, c.sliding_window);
    EXPECT_EQ(back.global_every, c.global_every);
    EXPECT_EQ(back.rope_local_theta, c.rope_local_theta);
    EXPECT_EQ(&models::spec_of(back), &s);
  }
}

// A family's reader refuses what its model here cannot hold, naming the file and the field.
TEST(ModelSpec, ReadersRefuseWhatTheirModelCannotHoldByName) {
  const models::ModelSpec& llama = *models::spec_named("llama");
  nlohmann::json j = nlohmann::json::parse(llama.write_hf_config(llama_like()));
  j["attention_bias"] = true;
  EXPECT_NE(error_of([&] {
              (void)llama.read_hf_config(j.dump(), "m/config.json");
            }).find("m/config.json: attention_bias true"),
            std::string::npos);
  const models::ModelSpec& gemma3 = *models::spec_named("gemma3");
  nlohmann::json g = nlohmann::json::parse(gemma3.write_hf_config(one_of_each()[4].second));
  g["final_logit_softcapping"] = 30.0;
  EXPECT_NE(error_of([&] { (void)gemma3.read_hf_config(g.dump(), "g/config.json"); })
                .find("g/config.json: final_logit_softcapping 30.0 (logit softcapping) is not "
                      "supported"),
            std::string::npos);
}

// A mix of options no family holds: no export (refused by name), but it trains as its form's.
TEST(ModelSpec, AMixOfOptionsNoFamilyHoldsIsRefusedForExportAndTrainsAsItsForm) {
  nn::TransformerConfig both = llama_like();
  both.qk_norm = both.qkv_bias = true;
  EXPECT_NE(error_of([&] {
              (void)models::spec_of(both);
            }).find("q/k norms and q/k/v biases (no o_proj bias) is no family's"),
            std::string::npos);
  nn::TransformerConfig some = llama_like();
  some.geglu = true;
  EXPECT_NE(error_of([&] { (void)models::spec_of(some); })
                .find("some of Gemma 3's options but not all (qk_norm false, norm_plus_one false, "
                      "sandwich_norms false, geglu true"),
            std::string::npos);
  nn::TransformerConfig gemma_biased = one_of_each()[4].second;
  gemma_biased.qkv_bias = true;
  EXPECT_NE(error_of([&] {
              (void)models::spec_of(gemma_biased);
            }).find("a Gemma 3 model with q/k/v biases is no family's"),
            std::string::npos);
  for (const nn::TransformerConfig& c : {both, some, gemma_biased})
    EXPECT_EQ(models::spec_to_train(c).name, "llama");
}
