// The model specs (fsdp/models/spec.h, src/models/<family>/): each family's own config is its and
// no other family's; its config.json, written and read back, is the same model; the registry
// finds a family by model_type and by name; a mix of options no family holds is refused by name
// for export (spec_of) and trains as its form's (spec_to_train). The families' numbers against
// transformers are families_ref_test's and gemma3_ref_test's (with torch).
#include <cstddef>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/models/spec.h"
#include "fsdp/models/state_dict_adapter.h"
#include "fsdp/nn/transformer.h"
#include "test_util.h"

using namespace fsdp;
using test::error_of;

namespace {

nn::TransformerConfig llama_like() {
  nn::TransformerConfig c = nn::TransformerConfig::preset("tiny");
  c.arch = nn::Arch::decoder;
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
  nn::TransformerConfig qwen3_moe = qwen3;
  qwen3_moe.tie_embeddings = false;
  qwen3_moe.moe = {.experts = 8, .top_k = 2, .hidden = 64, .norm_topk_prob = true,
                   .dense_layers = {0}, .aux_coef = 0.001};
  nn::TransformerConfig mixtral = llama_like();
  mixtral.ffn_hidden = 64;
  mixtral.moe = {.experts = 4, .top_k = 2, .hidden = 64, .router = nn::RouterKind::topk_softmax,
                 .aux_coef = 0.02};
  nn::TransformerConfig olmo2 = llama_like();  // OLMo-2's by its family key alone
  olmo2.family = "olmo2";
  olmo2.family_options = R"({"attention_bias":false})";
  olmo2.norm_eps = 1e-5;
  return {{"seed", seed},       {"llama", llama},     {"qwen2", qwen2},
          {"qwen3", qwen3},     {"gemma3", gemma3},   {"mistral", mistral},
          {"qwen3_moe", qwen3_moe}, {"mixtral", mixtral}, {"olmo2", olmo2}};
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
    // A config that names its family is that family's (its options held); one without the key
    // finds it by `matches`, which holds it for one family only.
    if (c.family.empty())
      EXPECT_EQ(matched, 1);
    else
      EXPECT_TRUE(models::spec_named(c.family)->matches(c));
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

// qwen3_moe's and mixtral's experts: our stacked [E, ...] parameters are Hugging Face's tensors one per expert
// and llama.cpp's one 3-D tensor per projection; a mixture of experts without QK-norm is no family's (it
// trains as llama's form, no export); what llama.cpp's qwen3moe cannot represent is refused by name.
TEST(ModelSpec, MoeFamiliesNameTheirExpertsOnePerExpert) {
  const nn::TransformerConfig c = one_of_each()[6].second;
  const models::StateDictAdapter& a = *models::spec_of(c).adapter;
  EXPECT_EQ(a.stacked_names("layers.2.ffn.experts.down_proj", models::Naming::hf, 3),
            (std::vector<std::string>{"model.layers.2.mlp.experts.0.down_proj.weight",
                                      "model.layers.2.mlp.experts.1.down_proj.weight",
                                      "model.layers.2.mlp.experts.2.down_proj.weight"}));
  EXPECT_TRUE(a.stacked_names("layers.2.ffn.w1.weight", models::Naming::hf, 3).empty());
  EXPECT_TRUE(a.stacked_names("layers.2.ffn.experts.up_proj", models::Naming::gguf, 3).empty());
  EXPECT_EQ(a.rename("layers.1.ffn.gate.weight", models::Naming::ours, models::Naming::hf),
            "model.layers.1.mlp.gate.weight");
  EXPECT_EQ(a.rename("layers.0.ffn.w1.weight", models::Naming::ours, models::Naming::hf),
            "model.layers.0.mlp.gate_proj.weight");
  nn::TransformerConfig no_qk = c;
  no_qk.qk_norm = false;
  EXPECT_NE(error_of([&] { (void)models::spec_of(no_qk); }).find("mixture of experts"),
            std::string::npos);
  EXPECT_EQ(models::spec_to_train(no_qk).name, "llama");
  EXPECT_EQ(a.rename("layers.2.ffn.experts.down_proj", models::Naming::ours, models::Naming::gguf),
            "blk.2.ffn_down_exps.weight");
  EXPECT_EQ(a.rename("blk.0.ffn_gate_exps.weight", models::Naming::gguf, models::Naming::ours),
            "layers.0.ffn.experts.gate_proj");
  EXPECT_EQ(a.rename("layers.1.ffn.gate.weight", models::Naming::ours, models::Naming::gguf),
            "blk.1.ffn_gate_inp.weight");
  EXPECT_EQ(a.rename("layers.2.ffn.experts.down_proj", models::Naming::ours, models::Naming::hf), "");
  // c's first block is dense (mlp_only_layers [0]): llama.cpp's qwen3moe has experts in each.
  EXPECT_NE(error_of([&] { models::spec_of(c).check_gguf(c); }).find("1 of 4 blocks are dense"),
            std::string::npos);
  nn::TransformerConfig all_sparse = c;
  all_sparse.moe.dense_layers.clear();
  EXPECT_EQ(error_of([&] { models::spec_of(all_sparse).check_gguf(all_sparse); }), "");
  nn::TransformerConfig no_norm = all_sparse;
  no_norm.moe.norm_topk_prob = false;
  EXPECT_NE(error_of([&] { models::spec_of(no_norm).check_gguf(no_norm); })
                .find("norm_topk_prob false (the top k's weights not renormalized) is not "
                      "representable in llama.cpp's qwen3moe"),
            std::string::npos);
  // transformers 5 names Qwen3-MoE's expert count num_local_experts (4: num_experts).
  {
    const nn::TransformerConfig q = one_of_each()[6].second;
    const models::ModelSpec& qs = models::spec_of(q);
    nlohmann::json v5 = nlohmann::json::parse(qs.write_hf_config(q));
    v5["num_local_experts"] = v5.at("num_experts");
    v5.erase("num_experts");
    EXPECT_EQ(qs.read_hf_config(v5.dump(), "q/config.json").to_json(), q.to_json());
    v5["num_experts"] = q.moe.experts + 1;
    EXPECT_NE(error_of([&] { (void)qs.read_hf_config(v5.dump(), "q/config.json"); })
                  .find("q/config.json: num_experts 9 and num_local_experts 8 disagree"),
              std::string::npos);
  }
  // Mixtral's: w1, w3, w2 under block_sparse_moe.
  const nn::TransformerConfig m = one_of_each()[7].second;
  EXPECT_EQ(models::spec_of(m).adapter->stacked_names("layers.0.ffn.experts.up_proj",
                                                      models::Naming::hf, 1),
            (std::vector<std::string>{"model.layers.0.block_sparse_moe.experts.0.w3.weight"}));
  nlohmann::json j = nlohmann::json::parse(models::spec_of(m).write_hf_config(m));
  j["sliding_window"] = 4096;
  EXPECT_NE(error_of([&] { (void)models::spec_of(m).read_hf_config(j.dump(), "x/config.json"); })
                .find("x/config.json: sliding_window 4096"),
            std::string::npos);
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

// Every family names its configs (models::named_config, the config JSON's "family"): one written
// before the key, a preset's with the family's options, and those its readers build from a
// config.json (checkpoint::config_from_family); a mix of options no family holds stays unnamed
// and trains as its form's family, and so does the seed's (its name is a run config's "seed" key,
// the run's random seed, which fsdp-train's checkpoints hold beside the model's keys).
TEST(ModelSpec, EveryFamilyNamesItsConfigsAndAMixStaysUnnamed) {
  for (const auto& [name, c] : one_of_each()) {
    SCOPED_TRACE(name);
    const nn::TransformerConfig named = models::named_config(c);
    const std::string want = name == "seed" ? "" : name;
    EXPECT_EQ(named.family, want);
    EXPECT_EQ(nlohmann::json::parse(named.to_json()).value("family", ""), want);
    EXPECT_EQ(nn::TransformerConfig::from_json(named.to_json()).family, want);
    EXPECT_EQ(&models::spec_of(named), &models::spec_of(c));
    EXPECT_EQ(models::named_config(named).to_json(), named.to_json());
    const models::ModelSpec& s = models::spec_of(c);
    if (s.write_hf_config)
      EXPECT_EQ(checkpoint::config_from_family(std::string(s.hf_model_type), s.write_hf_config(c),
                                               name + "/config.json")
                    .family,
                name);
  }
  EXPECT_EQ(checkpoint::config_from_family("minillm", llama_like().to_json(), "m/config.json")
                .family,
            "llama");
  nn::TransformerConfig mix = llama_like();
  mix.geglu = true;  // an experiment: GeGLU on llama
  EXPECT_EQ(models::named_config(mix).family, "");
  EXPECT_EQ(models::spec_to_train(models::named_config(mix)).name, "llama");
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

// A config names its family ("family" in the config JSON and so in the checkpoint): spec_of takes
// that family, refusing by name one that is none or that does not hold the config's options; the
// key and the family's own options object (under its name) round-trip through the JSON; a config
// without the key (written before it) still finds its family by its options.
TEST(ModelSpec, AConfigNamesItsFamilyAndCarriesItsOptionsUnderItsName) {
  nn::TransformerConfig q = one_of_each()[3].second;  // qwen3's options
  q.family = "qwen3";
  EXPECT_EQ(models::spec_of(q).name, "qwen3");
  const nlohmann::json j = nlohmann::json::parse(q.to_json());
  EXPECT_EQ(j.at("family"), "qwen3");
  EXPECT_EQ(nn::TransformerConfig::from_json(q.to_json()).to_json(), q.to_json());
  q.family_options = R"({"x":1})";
  const nlohmann::json with = nlohmann::json::parse(q.to_json());
  EXPECT_EQ(with.at("qwen3"), nlohmann::json::parse(R"({"x":1})"));
  EXPECT_EQ(nn::TransformerConfig::from_json(q.to_json()).family_options, q.family_options);
  nn::TransformerConfig wrong = llama_like();  // llama's options, named qwen3
  wrong.family = "qwen3";
  EXPECT_NE(error_of([&] { (void)models::spec_of(wrong); })
                .find("the config names the family qwen3 (Qwen3: llama with QK-norm and no "
                      "biases) but holds options that are not its (arch llama, qkv_bias false, "
                      "qk_norm false"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)models::spec_to_train(wrong); }).find("names the family qwen3"),
            std::string::npos);
  wrong.family = "gpt2";
  EXPECT_NE(error_of([&] { (void)models::spec_of(wrong); })
                .find("the config names the family 'gpt2', which is none of seed, llama,"),
            std::string::npos);
  nlohmann::json bad = nlohmann::json::parse(llama_like().to_json());
  bad["family"] = 3;
  EXPECT_NE(error_of([&] { (void)nn::TransformerConfig::from_json(bad.dump()); })
                .find("config field 'family' must be a string, got 3"),
            std::string::npos);
  bad["family"] = "Qwen 3";
  EXPECT_NE(error_of([&] { (void)nn::TransformerConfig::from_json(bad.dump()); })
                .find("config field 'family' must be a family's name (a-z, 0-9, _), got 'Qwen 3'"),
            std::string::npos);
  bad["family"] = "qwen3";
  bad["qwen3"] = 5;
  EXPECT_NE(error_of([&] { (void)nn::TransformerConfig::from_json(bad.dump()); })
                .find("config field 'qwen3' (the qwen3 family's options) must be an object, got 5"),
            std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(llama_like().to_json()).count("family"), 0u);  // as before
  // A config that names its family is built with that family's blocks (OLMo-2's are its own),
  // by nn::Transformer(config) as by the spec: the same parameters, in the same order.
  nn::TransformerConfig olmo2 = one_of_each().back().second;
  ASSERT_EQ(olmo2.family, "olmo2");
  const auto names = [](nn::Module& m) {
    std::vector<std::pair<std::string, Shape>> v;
    for (const auto& [name, p] : m.named_parameters()) v.emplace_back(name, p->shape);
    return v;
  };
  for (const nn::TransformerConfig& c : {olmo2, q}) {
    nn::Transformer direct(c);
    EXPECT_EQ(names(direct), names(*models::spec_of(c).build(c))) << c.family;
  }
  nn::Transformer own(olmo2), llamas(olmo2, nn::default_block);
  EXPECT_NE(names(own), names(llamas));  // OLMo-2's blocks, not llama's
  nn::TransformerConfig unknown = q;
  unknown.family = "nosuch";
  EXPECT_NE(error_of([&] { nn::Transformer m(unknown); }).find("nosuch"), std::string::npos);
}

// OLMo-2 (src/models/olmo2/): its options live under "olmo2" in the config JSON and round-trip;
// its config.json both ways keeps attention_bias and Olmo2Config's rms_norm_eps default (1e-5);
// what its block cannot hold is refused by name; its parameters are named as Olmo2ForCausalLM's;
// the count from the config is the built model's; its GGUF export is refused by name.
TEST(ModelSpec, Olmo2OptionsLiveUnderItsNameAndItsNamesAreOlmo2ForCausalLMs) {
  nn::TransformerConfig c = one_of_each()[8].second;
  c.family_options = R"({"attention_bias":true})";
  const models::ModelSpec& s = models::spec_of(c);
  ASSERT_EQ(s.name, "olmo2");
  const nlohmann::json j = nlohmann::json::parse(c.to_json());
  EXPECT_EQ(j.at("family"), "olmo2");
  EXPECT_EQ(j.at("olmo2"), nlohmann::json::parse(R"({"attention_bias":true})"));
  EXPECT_EQ(nn::TransformerConfig::from_json(c.to_json()).to_json(), c.to_json());
  const std::string hf = s.write_hf_config(c);
  EXPECT_EQ(nlohmann::json::parse(hf).at("attention_bias"), true);
  EXPECT_EQ(s.read_hf_config(hf, "o/config.json").to_json(), c.to_json());
  nlohmann::json no_eps = nlohmann::json::parse(hf);
  no_eps.erase("rms_norm_eps");
  EXPECT_EQ(s.read_hf_config(no_eps.dump(), "o/config.json").norm_eps, 1e-5);
  for (bool bias : {true, false}) {
    c.family_options = bias ? R"({"attention_bias":true})" : R"({"attention_bias":false})";
    EXPECT_EQ(models::num_parameters(c), s.build(c)->num_parameters()) << bias;
  }
  // Its names: Hugging Face's and back; the in-projection's parts are q_proj, k_proj, v_proj.
  const models::StateDictAdapter& a = *s.adapter;
  std::set<std::string> hf_names;
  const auto model = s.build(c);
  for (auto& [name, p] : model->named_parameters()) {
    if (models::is_in_proj(name)) {
      for (const std::string& n : a.in_proj_names(name, models::Naming::hf)) hf_names.insert(n);
      continue;
    }
    const std::string h = a.rename(name, models::Naming::ours, models::Naming::hf);
    EXPECT_EQ(a.rename(h, models::Naming::hf, models::Naming::ours), name);
    hf_names.insert(h);
  }
  for (const char* n :
       {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.post_feedforward_layernorm.weight", "model.layers.3.mlp.gate_proj.weight",
        "model.layers.3.mlp.up_proj.weight", "model.layers.3.mlp.down_proj.weight"})
    EXPECT_EQ(hf_names.count(n), 1u) << n;
  EXPECT_EQ(hf_names.count("model.layers.0.input_layernorm.weight"), 0u);
  EXPECT_EQ(hf_names.size(), size_t(3 + 4 * 11));  // without the biases: 3 + 4 * 11 names
  // Refusals by name: an option that is not OLMo-2's, a shared option its block does not hold,
  // rope scaling in config.json, and llama.cpp's olmo2 (not written here).
  c.family_options = R"({"attention_bias":false,"sliding_window":4})";
  EXPECT_NE(error_of([&] { (void)models::spec_of(c); })
                .find("config field 'olmo2.sliding_window' is not an option of OLMo-2's"),
            std::string::npos);
  c.family_options = R"({"attention_bias":1})";
  EXPECT_NE(error_of([&] { (void)models::spec_of(c); }).find("olmo2.attention_bias: expected true or false"),
            std::string::npos);
  c.family_options = "";
  c.qk_norm = true;
  EXPECT_NE(error_of([&] { (void)models::spec_of(c); })
                .find("the config names the family olmo2 (OLMo-2: norms after"),
            std::string::npos);
  nlohmann::json scaled = nlohmann::json::parse(hf);
  scaled["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_NE(error_of([&] { (void)s.read_hf_config(scaled.dump(), "o/config.json"); })
                .find("o/config.json: rope_scaling"),
            std::string::npos);
  EXPECT_EQ(a.gguf_arch, "");  // fsdp-export --gguf refuses it: the olmo2 family has no llama.cpp
                               // architecture (checkpoint_test's export refusals)
}

namespace {
// Our parameter `name` through the adapter's Hugging Face and GGUF names and back: both exist and
// each leads back to it. Returns its Hugging Face name.
std::string expect_round_trip(const models::StateDictAdapter& a, const std::string& name) {
  using models::Naming;
  const std::string hf = a.rename(name, Naming::ours, Naming::hf);
  const std::string gguf = a.rename(name, Naming::ours, Naming::gguf);
  EXPECT_FALSE(hf.empty() || gguf.empty()) << name;
  EXPECT_EQ(a.rename(hf, Naming::hf, Naming::ours), name);
  EXPECT_EQ(a.rename(gguf, Naming::gguf, Naming::ours), name);
  EXPECT_EQ(a.rename(gguf, Naming::gguf, Naming::hf), hf);
  return hf;
}
}  // namespace

// The state-dict adapter of a family (here qwen2's, llama's names with its llama.cpp options):
// every parameter of a two-block llama with q/k/v biases named in Hugging Face's and llama.cpp's
// naming and back, the in-projection's parts by name, and names outside the table refused with "".
TEST(StateDictAdapter, EveryParameterRoundTripsThroughHuggingFaceAndGgufNames) {
  using models::Naming;
  nn::TransformerConfig cfg = nn::TransformerConfig::preset("tiny");
  cfg.arch = nn::Arch::decoder;
  cfg.layers = 2;
  cfg.qkv_bias = true;
  cfg.tie_embeddings = false;
  const models::ModelSpec& spec = models::spec_of(cfg);
  ASSERT_EQ(spec.name, "qwen2");
  const models::StateDictAdapter& a = *spec.adapter;
  auto rename = [&](const std::string& n, Naming from, Naming to) { return a.rename(n, from, to); };
  auto in_proj_names = [&](const std::string& n, Naming to) { return a.in_proj_names(n, to); };
  nn::Transformer model(cfg);
  int checked = 0;
  for (const auto& [name, param] : model.named_parameters()) {
    if (models::is_in_proj(name) || models::is_in_proj_bias(name)) {
      const std::string kind = models::is_in_proj(name) ? "weight" : "bias";
      const std::string layer = name.substr(7, name.find('.', 7) - 7);
      const auto hf = in_proj_names(name, Naming::hf);
      const auto gguf = in_proj_names(name, Naming::gguf);
      for (int i = 0; i < 3; ++i) {
        const std::string qkv(1, "qkv"[i]);
        EXPECT_EQ(hf[i], "model.layers." + layer + ".self_attn." + qkv + "_proj." + kind);
        EXPECT_EQ(gguf[i], "blk." + layer + ".attn_" + qkv + "." + kind);
        EXPECT_EQ(rename(gguf[i], Naming::gguf, Naming::hf), hf[i]);
        EXPECT_EQ(rename(hf[i], Naming::hf, Naming::ours), "") << "q, k and v are one of ours";
      }
      EXPECT_EQ(rename(name, Naming::ours, Naming::gguf), "");
    } else {
      const std::string hf = expect_round_trip(a, name);
      // llama's own adapter, and every relative's, name it alike.
      for (const char* family : {"llama", "qwen3", "mistral", "gemma3"})
        if (name.find("norm2") == std::string::npos || std::string_view(family) != "gemma3")
          EXPECT_EQ(models::spec_named(family)->adapter->rename(name, Naming::ours, Naming::hf), hf)
              << family << " " << name;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 3 + 2 * 8);  // embed, norm, head; a block: 2 norms, in-proj, its bias, out, 3 FFN
  EXPECT_EQ(rename("model.layers.0.input_layernorm.weight", Naming::hf, Naming::gguf),
            "blk.0.attn_norm.weight");
  for (const char* bad : {"blk.x.attn_norm.weight", "blk..attn_norm.weight", "blk.3.attn_nrm.weight",
                          "output_norm", "rope_freqs.weight"})
    EXPECT_EQ(rename(bad, Naming::gguf, Naming::hf), "") << bad;
}

// Gemma's sandwich block (gemma3's adapter): its pre-FFN norm (our norm2) is Hugging Face's
// pre_feedforward_layernorm and its post_attention_layernorm the attention output's norm; every
// parameter (QK-norm's too) round-trips through both namings, and llama's adapter is unchanged.
TEST(StateDictAdapter, SandwichNormsHaveGemmasNames) {
  using models::Naming;
  nn::TransformerConfig cfg = nn::TransformerConfig::preset("tiny");
  cfg.arch = nn::Arch::decoder, cfg.layers = 2, cfg.tie_embeddings = true;
  cfg.qk_norm = cfg.norm_plus_one = cfg.sandwich_norms = cfg.geglu = cfg.embed_scale = true;
  const models::ModelSpec& spec = models::spec_of(cfg);
  ASSERT_EQ(spec.name, "gemma3");
  const models::StateDictAdapter& a = *spec.adapter;
  auto rename = [&](const std::string& n, Naming from, Naming to) { return a.rename(n, from, to); };
  nn::Transformer model(cfg);
  int checked = 0;
  for (const auto& [name, param] : model.named_parameters()) {
    if (models::is_in_proj(name)) continue;
    expect_round_trip(a, name);
    ++checked;
  }
  EXPECT_EQ(checked, 1 + 1 + 2 * 10);  // embed, norm; a block: 4 norms, 2 q/k norms, out, 3 FFN
  EXPECT_EQ(rename("layers.1.norm2.weight", Naming::ours, Naming::hf),
            "model.layers.1.pre_feedforward_layernorm.weight");
  EXPECT_EQ(rename("layers.1.post_attn_norm.weight", Naming::ours, Naming::hf),
            "model.layers.1.post_attention_layernorm.weight");
  EXPECT_EQ(rename("layers.1.post_ffn_norm.weight", Naming::ours, Naming::gguf),
            "blk.1.post_ffw_norm.weight");
  EXPECT_EQ(models::spec_named("llama")->adapter->rename("layers.1.norm2.weight", Naming::ours,
                                                        Naming::hf),
            "model.layers.1.post_attention_layernorm.weight");
}

// Each family's adapter is found through the registry with llama.cpp's conventions as its own:
// llama's converter permuted q and k, the relatives' did not, gemma3's stores (1 + w) norms as
// 1 + w and spells its SentencePiece vocabulary (and gemma's and gemma2's) by id; mistral and seed
// have no llama.cpp architecture, and seed, with only our own names, is refused by name.
TEST(StateDictAdapter, TheRegistryFindsEachFamilysConventions) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "gemma3"}) {
    const models::ModelSpec* s = models::spec_for_gguf_arch(arch);
    ASSERT_TRUE(s) << arch;
    EXPECT_EQ(s->name, arch);
    EXPECT_EQ(s->adapter->gguf_half_split, std::string_view(arch) != "llama") << arch;
    EXPECT_EQ(s->adapter->gguf_norm_plus_one, std::string_view(arch) == "gemma3") << arch;
    EXPECT_EQ(s->adapter->spells_spm_by_id(arch), std::string_view(arch) == "gemma3") << arch;
  }
  EXPECT_TRUE(models::spec_named("gemma3")->adapter->spells_spm_by_id("gemma2"));
  EXPECT_FALSE(models::spec_named("llama")->adapter->spells_spm_by_id("gemma2"));
  EXPECT_EQ(models::spec_for_gguf_arch("gemma"), nullptr);
  EXPECT_EQ(models::spec_for_gguf_arch(""), nullptr);  // mistral's: no llama.cpp architecture
  EXPECT_EQ(models::gguf_archs(), "llama, qwen2, qwen3, gemma3, qwen3moe");
  // Mixtral's files are llama's (with experts): llama's reader reads them.
  EXPECT_EQ(models::spec_for_gguf_arch("qwen3moe"), models::spec_named("qwen3_moe"));
  EXPECT_EQ(models::spec_named("mixtral")->adapter->gguf_arch, "llama");
  nn::TransformerConfig seed = nn::TransformerConfig::preset("tiny");
  seed.arch = nn::Arch::seed;
  EXPECT_EQ(models::spec_of(seed).adapter, nullptr);
  const std::string err = error_of([&] { models::adapter_of(seed, "[export] a PEFT adapter"); });
  EXPECT_NE(err.find("[export] a PEFT adapter: the seed family"), std::string::npos) << err;
  nn::TransformerConfig llama = seed;
  llama.arch = nn::Arch::decoder;
  EXPECT_EQ(&models::adapter_of(llama, "[test]"), models::spec_named("llama")->adapter);
}
