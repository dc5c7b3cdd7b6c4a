// train: TrainOptions and its flag table (flags.def), and the Trainer on a world of one.
// Flags: every flag has one name, help and a default its own reading gives back; set_flag reads
// values as fsdp-train's command line does (the same FlagValue), names and aliases alike; a bad
// value or an unknown flag is refused, naming the flag and the value. Options: validate() names
// the flags of each rule it refuses; model_config() applies the overrides to the preset.
// ModelSpec: --arch reads the model specs' forms; each family's resume keys are its config's.
// Trainer: a run stopped at a checkpoint and resumed gives the uninterrupted run's losses
// exactly (train_cli_test and ckpt_test hold the same through fsdp-train, and at np 1-4); a
// Trainer handed its parts (TrainerParts) trains with them and its memory plan plans them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/interchange.h"
#include "fsdp/checkpoint/manager.h"
#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/distributed/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/models/spec.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/profiler/ceilings.h"
#include "fsdp/profiler/metrics.h"
#include "fsdp/train/loss.h"
#include "fsdp/train/memory_plan.h"
#include "fsdp/train/preference.h"
#include "fsdp/train/options.h"
#include "fsdp/train/step.h"
#include "fsdp/train/trainer.h"
#include "src/checkpoint/manifest.h"
#include "test_util.h"

using namespace fsdp;
using namespace fsdp::train;
namespace fs = std::filesystem;

namespace {

using test::error_of;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("train_test") {}
};

}  // namespace

TEST(Flags, EachHasOneNameHelpAndADefaultItsReadingGivesBack) {
  TrainOptions o;
  std::set<std::string> names;
  int flags = 0;
  visit_flags(o, [&](const FlagInfo& f, auto& field) {
    using T = std::remove_cvref_t<decltype(field)>;
    ++flags;
    const std::string name = f.name();
    SCOPED_TRACE(name);
    EXPECT_TRUE(name.starts_with("--") && name.find('_') == std::string::npos);
    EXPECT_TRUE(names.insert(name).second) << "two flags named " << name;
    if (!f.aliases.empty()) EXPECT_TRUE(names.insert(std::string(f.aliases)).second);
    EXPECT_FALSE(f.help.empty());
    EXPECT_FALSE(f.title.empty());
    if constexpr (std::is_same_v<T, bool>)
      EXPECT_EQ(f.is_switch, !field);
    else
      EXPECT_FALSE(f.is_switch);
    const std::string text = FlagValue<T>::str(field);
    if (!text.empty()) EXPECT_TRUE(FlagValue<T>::parse(name, text) == field) << text;
  });
  EXPECT_GE(flags, 50);  // the visit reached the table (59 flags when it was written)
}

TEST(Flags, SetFlagReadsValuesAsTheCommandLineDoes) {
  TrainOptions o;
  set_flag(o, "--lr", "1e-3");
  set_flag(o, "--clip", "0.5");  // an alias
  set_flag(o, "--lr-decay", "cosine");
  set_flag(o, "--shard", "none");
  set_flag(o, "--activation-checkpoint", "every:3");
  set_flag(o, "--profile-steps", "3:5");
  set_flag(o, "--kv-heads", "3");
  set_flag(o, "--arch", "llama");
  set_flag(o, "--param-dtype", "bf16");
  set_flag(o, "--resume", "true");
  set_flag(o, "--reshard-after-forward", "False");  // any case, as CLI11 reads a switch
  set_flag(o, "--device", "cuda:1");
  set_flag(o, "--seed", "18446744073709551615");
  EXPECT_EQ(o.optimizer.lr, 1e-3);
  EXPECT_EQ(o.optimizer.grad_clip, 0.5);
  EXPECT_EQ(o.schedule.lr_decay, optim::Decay::cosine);
  EXPECT_EQ(o.sharding.shard, ShardMode::none);
  EXPECT_EQ(o.sharding.activation_checkpoint.every, 3);
  EXPECT_EQ(o.profile.profile_steps, (StepRange{3, 5}));
  EXPECT_EQ(o.model.kv_heads, std::optional<int64_t>(3));
  EXPECT_EQ(o.model.arch, std::optional<nn::Arch>(nn::Arch::decoder));
  EXPECT_EQ(o.sharding.param_dtype, std::optional<DType>(DType::bf16));
  EXPECT_TRUE(o.checkpoint.resume);
  EXPECT_FALSE(o.sharding.reshard_after_forward);
  EXPECT_EQ(o.run.device, Device::cuda(1));
  EXPECT_EQ(o.run.seed, UINT64_MAX);
  EXPECT_EQ(FlagValue<ActivationCheckpoint>::str({1}), "full");
  EXPECT_EQ(FlagValue<ActivationCheckpoint>::str({4}), "every:4");
}

TEST(Flags, ABadValueOrAnUnknownFlagIsRefusedByName) {
  TrainOptions o;
  auto refused = [&](const char* flag, const char* text) {
    return error_of([&] { set_flag(o, flag, text); });
  };
  EXPECT_NE(refused("--steps", "1.5").find("--steps takes an integer, got '1.5'"),
            std::string::npos);
  EXPECT_NE(refused("--steps", "99999999999999999999").find("(out of range)"), std::string::npos);
  EXPECT_NE(refused("--lr", "fast").find("--lr takes a number, got 'fast'"), std::string::npos);
  EXPECT_NE(refused("--lr", "").find("--lr takes a number"), std::string::npos);
  EXPECT_NE(refused("--seed", "-1").find("--seed takes an integer >= 0, got '-1'"),
            std::string::npos);
  EXPECT_NE(refused("--shard", "half").find("--shard must be full or none, got 'half'"),
            std::string::npos);
  EXPECT_NE(refused("--lr-decay", "step").find("--lr-decay must be none, cosine or linear"),
            std::string::npos);
  EXPECT_NE(refused("--activation-checkpoint", "every:0").find("got 'every:0'"), std::string::npos);
  EXPECT_NE(refused("--activation-checkpoint", "every:").find("got 'every:'"), std::string::npos);
  EXPECT_NE(refused("--profile-steps", "5:3").find("need 0 <= A < B"), std::string::npos);
  EXPECT_NE(refused("--profile-steps", ":3").find("must be A:B"), std::string::npos);
  EXPECT_NE(refused("--profile-steps", "99999999999999999999:5").find("must be A:B"),
            std::string::npos);  // out of range, not read as 0
  EXPECT_NE(refused("--activation-checkpoint", "full:2").find("got 'full:2'"), std::string::npos);
  EXPECT_NE(refused("--resume", "maybe").find("--resume takes true or false, got 'maybe'"),
            std::string::npos);
  EXPECT_NE(refused("--nope", "1").find("no flag named '--nope'"), std::string::npos);
  // Another library's refusal, under the flag's name, with one place in the source.
  const std::string dtype = refused("--dtype", "f8");
  EXPECT_NE(dtype.find("--dtype: [dtype] unknown dtype 'f8'"), std::string::npos) << dtype;
  EXPECT_EQ(dtype.find("(at "), dtype.rfind("(at ")) << dtype;
  EXPECT_NE(refused("--device", "tpu").find("--device: [device] unknown device 'tpu'"),
            std::string::npos);
  // A refused value leaves the field as it was.
  EXPECT_EQ(o.schedule.steps, 5);
  EXPECT_EQ(o.sharding.shard, ShardMode::full);
}

TEST(Flags, FlagsJsonWritesEveryFlagAsTheCommandLineReadsIt) {
  TrainOptions o;
  set_flag(o, "--lr", "0.001");
  set_flag(o, "--activation-checkpoint", "every:2");
  const nlohmann::json j = nlohmann::json::parse(flags_json(o));
  EXPECT_EQ(j.at("--lr"), "0.001");
  EXPECT_EQ(j.at("--activation-checkpoint"), "every:2");
  EXPECT_EQ(j.at("--kv-heads"), "");  // unset
  TrainOptions back;                  // each value read back gives the same options
  for (const auto& [flag, value] : j.items())
    if (!value.get<std::string>().empty()) set_flag(back, flag, value.get<std::string>());
  EXPECT_EQ(flags_json(back), flags_json(o));
}

TEST(Options, ValidateNamesTheFlagsOfTheRuleItRefuses) {
  auto refused = [](auto&& edit) {
    TrainOptions o;
    edit(o);
    return error_of([&] { o.validate(); });
  };
  EXPECT_EQ(refused([](TrainOptions&) {}), "");
  EXPECT_NE(
      refused([](TrainOptions& o) { o.schedule.steps = -1; }).find("--steps must be >= 0, got -1"),
      std::string::npos);
  EXPECT_NE(refused([](TrainOptions& o) {
              o.checkpoint.overwrite = true;
            }).find("--overwrite needs --ckpt-dir"),
            std::string::npos);
  EXPECT_NE(refused([](TrainOptions& o) {
              o.checkpoint = {.ckpt_dir = "x", .resume = true, .overwrite = true};
            }).find("choose one"),
            std::string::npos);
  EXPECT_NE(refused([](TrainOptions& o) {
              o.sharding.shard = ShardMode::none;
              o.sharding.param_dtype = DType::bf16;
            }).find("--param-dtype and --reduce-dtype need --shard full"),
            std::string::npos);
  EXPECT_NE(refused([](TrainOptions& o) {
              o.schedule.min_lr = 1.0;
            }).find("--min-lr 1 is above --lr 0.0003"),
            std::string::npos);
  EXPECT_NE(refused([](TrainOptions& o) {
              o.run.backend = "carrier-pigeon";
            }).find("--backend must be nccl, mpi, gloo or local, got 'carrier-pigeon'"),
            std::string::npos);
  EXPECT_NE(refused([](TrainOptions& o) {
              o.sharding.dtype = DType::bf16;
            }).find("--dtype bf16 is not a CPU training dtype"),
            std::string::npos);
  // LoRA: a bf16 base beside f32 adapters; replicate cannot keep a frozen base apart.
  EXPECT_EQ(refused([](TrainOptions& o) {
              o.sharding.dtype = DType::bf16;
              o.model.lora_rank = 4;
            }),
            "");
  EXPECT_NE(refused([](TrainOptions& o) {
              o.model.lora_rank = 4;
              o.sharding.shard = ShardMode::none;
            }).find("--lora-rank 4 needs --shard full"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              TrainOptions o;
              o.model.lora_rank = -1;
              (void)o.lora_config(nn::Arch::decoder);
            }).find("--lora-rank must be >= 0"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              TrainOptions o;
              o.model.lora_rank = 4;
              o.model.lora_targets = "q,proj";
              (void)o.lora_config(nn::Arch::decoder);
            }).find("unknown target 'proj'"),
            std::string::npos);
  // --pack-eos: an id, and only with --pack; --val-data: not the training data itself.
  EXPECT_NE(refused([](TrainOptions& o) {
              o.data.pack = true;
              o.data.pack_eos = -5;
            }).find("--pack-eos must be a token id >= 0 (unset: the tokenizer's EOS), got -5"),
            std::string::npos);
  EXPECT_NE(
      refused([](TrainOptions& o) { o.data.pack_eos = 10; }).find("--pack-eos 10 needs --pack"),
      std::string::npos);
  EXPECT_EQ(refused([](TrainOptions& o) {
              o.data.pack = true;
              o.data.pack_eos = 10;
            }),
            "");
  EXPECT_NE(refused([](TrainOptions& o) {
              o.data.data = o.data.val_data = "corpus.txt";
            }).find("--val-data corpus.txt is the --data file corpus.txt"),
            std::string::npos);
  TrainOptions all;  // --lora-targets all: every projection the architecture has
  all.model.lora_rank = 4;
  EXPECT_EQ(all.lora_config(nn::Arch::decoder).targets,
            nn::parse_lora_targets("q,k,v,o,gate,up,down"));
  EXPECT_EQ(all.lora_config(nn::Arch::seed).targets, nn::parse_lora_targets("q,k,v,o,up,down"));
  // A mixture of experts: its attention (the experts and the router stay frozen).
  EXPECT_EQ(all.lora_config(nn::Arch::decoder, true).targets, nn::parse_lora_targets("q,k,v,o"));
}

TEST(Options, ModelConfigIsThePresetWithTheOverrides) {
  TrainOptions o;
  const nn::TransformerConfig tiny = nn::TransformerConfig::preset("tiny");
  EXPECT_EQ(o.model_config().to_json(), tiny.to_json());
  set_flag(o, "--arch", "llama");
  set_flag(o, "--heads", "4");
  set_flag(o, "--kv-heads", "2");
  set_flag(o, "--tie-embeddings", "true");
  const nn::TransformerConfig c = o.model_config();
  EXPECT_EQ(c.arch, nn::Arch::decoder);
  EXPECT_EQ(c.heads, 4);
  EXPECT_EQ(c.resolved_kv_heads(), 2);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.dim, tiny.dim);
  set_flag(o, "--kv-heads", "3");  // does not divide the heads: the model's own check
  EXPECT_NE(error_of([&] { (void)o.model_config(); }), "");
}

// The model specs (fsdp/models/spec.h): --arch reads the names of the families that are a module
// tree's form (seed, llama), and every family's resume keys are keys of its config's JSON (a key
// missing there would never be compared); its GEMM shapes are one rank's tokens, and it builds.
TEST(ModelSpec, ArchReadsTheFormsAndEachFamilysKeysAreItsConfigs) {
  ASSERT_FALSE(models::model_specs().empty());
  int forms = 0;
  for (const models::ModelSpec* f : models::model_specs()) {
    SCOPED_TRACE(std::string(f->name));
    if (f->name == nn::arch_name(f->arch)) {
      ++forms;
      EXPECT_EQ(FlagValue<nn::Arch>::parse("--arch", f->name), f->arch);
      EXPECT_EQ(FlagValue<nn::Arch>::str(f->arch), f->name);
    } else {
      EXPECT_NE(error_of([&] { (void)FlagValue<nn::Arch>::parse("--arch", f->name); }), "");
    }
    nn::TransformerConfig c = nn::TransformerConfig::preset("tiny");
    c.arch = f->arch;
    nn::TransformerConfig every = c;  // the JSON names an option only when it is not the default
    every.heads = 8, every.kv_heads = 2, every.head_dim = 16;
    every.tie_embeddings = every.qkv_bias = every.qk_norm = true;
    every.rope_scaling.factor = 8.0;
    every.norm_eps = 1e-5;
    every.lora = {.rank = 4, .alpha = 8, .targets = nn::parse_lora_targets("q,v")};
    every.norm_plus_one = every.sandwich_norms = every.geglu = every.embed_scale = true;
    every.sliding_window = 8, every.global_every = 2, every.rope_local_theta = 1e4;
    every.moe = {.experts = 4, .top_k = 2, .hidden = 8};
    every.family = std::string(f->name);  // named, with its own options under its name (olmo2's)
    every.family_options = "{}";
    const nlohmann::json j = nlohmann::json::parse(every.to_json());
    for (std::string_view key : f->shape_keys) EXPECT_TRUE(j.contains(key)) << key;
    const std::vector<profiler::GemmShape> shapes = f->gemm_shapes(c);
    ASSERT_FALSE(shapes.empty());
    EXPECT_EQ(shapes.front().m, c.batch * c.seq);  // one rank's tokens
    EXPECT_NE(f->build(c), nullptr);
  }
  EXPECT_EQ(forms, 2);
}

// The losses of a JSONL --log-file, by step.
std::vector<double> logged_losses(const fs::path& file) {
  std::vector<double> losses;
  std::ifstream f(file);
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    losses.resize(size_t(j.at("step").get<int64_t>()) + 1);
    losses.back() = j.at("loss").get<double>();
  }
  return losses;
}

// A llama of 2 blocks of width 32, grouped-query, on rows of 16.
const std::vector<std::pair<const char*, const char*>> kSmallLlama = {
    {"--arch", "llama"}, {"--vocab", "64"}, {"--seq", "16"},     {"--dim", "32"},
    {"--layers", "2"},   {"--heads", "4"},  {"--kv-heads", "2"}, {"--batch", "2"}};

// Trains 6 steps whole, and 4 then 2 more resumed from the checkpoint of step 4 (in tmp/ck):
// the same losses, bit for bit. `more` are flags beside the small llama's.
// `between` runs on tmp/ck between the two parts.
void expect_resume_equals_uninterrupted(
    const TempDir& tmp, const std::shared_ptr<dist::ProcessGroup>& pg,
    const std::vector<std::pair<const char*, const char*>>& more,
    const std::function<void(const fs::path& ck)>& between = {}) {
  TrainOptions o;
  for (const auto& [flag, value] : kSmallLlama) set_flag(o, flag, value);
  const std::vector<std::pair<const char*, const char*>> flags = {
      {"--lr", "1e-2"},
      {"--lr-decay", "cosine"},
      {"--warmup-steps", "2"},
      {"--decay-steps", "6"}};  // the schedule of all 6 steps, in the run stopped at 4 too
  for (const auto& [flag, value] : flags) set_flag(o, flag, value);
  for (const auto& [flag, value] : more) set_flag(o, flag, value);
  o.schedule.steps = 6;
  o.sample.sample_tokens = 0;
  o.profile.log_every = 0;  // no step lines; the log has every step
  TrainOptions whole = o;
  whole.profile.log_file = (tmp.path / "whole.jsonl").string();
  {
    Trainer t(whole, pg);
    EXPECT_EQ(t.start_step(), 0);
    t.fit();
    EXPECT_EQ(t.steps_done(), 6);
  }
  TrainOptions first = o;
  first.schedule.steps = 4;
  first.checkpoint = {.ckpt_dir = (tmp.path / "ck").string(), .ckpt_every = 4};
  first.profile.log_file = (tmp.path / "parts.jsonl").string();
  {
    Trainer t(first, pg);
    t.fit();
  }
  if (between) between(tmp.path / "ck");
  TrainOptions rest = first;
  rest.schedule.steps = 6;
  rest.checkpoint.resume = true;
  {
    testing::internal::CaptureStdout();
    Trainer t(rest, pg);
    const std::string out = testing::internal::GetCapturedStdout();
    EXPECT_NE(out.find("resume: flags changed since the checkpoint: --steps 4 -> 6\n"),
              std::string::npos)
        << out;
    EXPECT_EQ(t.start_step(), 4);
    t.fit();
    EXPECT_EQ(t.steps_done(), 6);
  }
  const std::vector<double> a = logged_losses(whole.profile.log_file);
  const std::vector<double> b = logged_losses(first.profile.log_file);  // appended on resume
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t s = 0; s < a.size(); ++s) EXPECT_EQ(a[s], b[s]) << "step " << s;
}

TEST(Trainer, AResumedRunGivesTheUninterruptedRunsLossesExactly) {
  TempDir tmp;
  auto pg = dist::init_process_group();
  expect_resume_equals_uninterrupted(tmp, pg, {});
  dist::destroy_process_group();
}

// A checkpoint as configs were before they named their family: the newest one's config without
// its "family" key (the key the run wrote, "llama"), resealed (complete.json's checksum of the new
// metadata.json).
void strip_family(const fs::path& ck) {
  const fs::path step = checkpoint::latest(ck.string());
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(step / "metadata.json"));
  ASSERT_EQ(meta.at("config").at("family"), "llama");
  meta["config"].erase("family");
  const std::string bytes = meta.dump();
  std::ofstream(step / "metadata.json", std::ios::binary | std::ios::trunc) << bytes;
  const nlohmann::json seal = nlohmann::json::parse(std::ifstream(step / "complete.json"));
  std::ofstream(step / "complete.json", std::ios::binary | std::ios::trunc)
      << checkpoint::detail::complete_record(bytes, seal.at("run_id").get<std::string>(),
                                             seal.at("step").get<int64_t>());
}

// A run's config names its family (models::named_config: here the flags' llama), and so does its
// checkpoint. A checkpoint written before that (no "family" key) resumes into the family its
// options are, with the uninterrupted run's losses; a run of another family (here qwen3's, by
// --qk-norm) is refused by the family's name, from that checkpoint and from one that names its
// family.
TEST(Trainer, ACheckpointBeforeFamilyKeysResumesIntoItsFamilyAndAnotherIsRefused) {
  TempDir tmp;
  auto pg = dist::init_process_group();
  expect_resume_equals_uninterrupted(tmp, pg, {}, strip_family);
  TrainOptions o;
  for (const auto& [flag, value] : kSmallLlama) set_flag(o, flag, value);
  set_flag(o, "--qk-norm", "true");
  o.schedule.steps = 6;
  o.sample.sample_tokens = 0;
  o.profile.log_every = 0;
  o.checkpoint = {.ckpt_dir = (tmp.path / "ck").string(), .resume = true};
  strip_family(tmp.path / "ck");  // step 6's, which the resumed run wrote with the key
  const std::string unnamed = error_of([&] { Trainer t(o, pg); });
  EXPECT_NE(unnamed.find("was saved before configs named their family; its options are the llama "
                         "family's, but this run trains the qwen3 family"),
            std::string::npos)
      << unnamed;
  TrainOptions named = o;  // step 6's checkpoint names its family
  named.checkpoint.ckpt_dir = (tmp.path / "named").string();
  named.checkpoint.resume = false;
  named.checkpoint.ckpt_every = 2;
  named.model.qk_norm = false;
  named.schedule.steps = 2;
  {
    Trainer t(named, pg);
    t.fit();
  }
  o.checkpoint.ckpt_dir = named.checkpoint.ckpt_dir;
  const std::string refused = error_of([&] { Trainer t(o, pg); });
  EXPECT_NE(refused.find("was saved with family \"llama\" but this run has family \"qwen3\""),
            std::string::npos)
      << refused;
  dist::destroy_process_group();
}

// LoRA (--lora-rank): a resumed run equals the uninterrupted one; its checkpoint holds the
// adapters alone (and their AdamW state) and names the frozen base, here the seed's
// initialisation, by content: a resume whose base differs (another seed) or that drops the
// adapters is refused by name. The consolidated base is the seed's initialisation, and the merged
// model its weights plus (alpha / rank) B A.
TEST(Trainer, LoraResumesExactlyAndItsCheckpointHoldsTheAdaptersAlone) {
  TempDir tmp;
  auto pg = dist::init_process_group();
  expect_resume_equals_uninterrupted(
      tmp, pg, {{"--lora-rank", "4"}, {"--lora-alpha", "8"}, {"--lora-targets", "q,v,o,down"}});
  const std::string step = (tmp.path / "ck" / "step_00000006").string();
  const nlohmann::json meta =
      nlohmann::json::parse(std::ifstream(fs::path(step) / "metadata.json"));
  int adapters = 0;
  for (const auto& [name, t] : meta.at("tensors").items()) {
    EXPECT_TRUE(nn::is_lora_parameter(name)) << name;
    ++adapters;
  }
  EXPECT_EQ(adapters, 2 * 3 * 2);  // 2 layers: the in-projection's pair, o's and down's
  EXPECT_EQ(meta.at("frozen").size(), 3u + 2u * 7u);  // embed, norm, head; 7 weights a block
  EXPECT_EQ(meta.at("config").at("base_content"), "initialised from seed 1337");
  nn::TransformerConfig cfg;
  const checkpoint::NamedTensors unmerged = checkpoint::consolidate(step, &cfg, false);
  EXPECT_EQ(cfg.lora.rank, 4);
  EXPECT_EQ(cfg.family, "llama");  // the run's config names its family: its spec builds it
  const std::unique_ptr<nn::Transformer> built = models::spec_of(cfg).build(cfg);
  nn::Transformer& fresh = *built;
  nn::materialize(fresh, DType::f32, 1337);
  for (const auto& [name, t] : unmerged)
    if (!nn::is_lora_parameter(name))
      EXPECT_EQ(t.to_f64_vector(), fresh.parameter(name).data.to_f64_vector()) << name;
  nn::TransformerConfig merged_cfg;
  const checkpoint::NamedTensors merged = checkpoint::consolidate(step, &merged_cfg);
  EXPECT_FALSE(merged_cfg.lora.enabled());
  const checkpoint::NamedTensors want = checkpoint::merge_lora(cfg, unmerged);
  ASSERT_EQ(merged.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(merged[i].first, want[i].first);
    EXPECT_EQ(merged[i].second.to_f64_vector(), want[i].second.to_f64_vector()) << want[i].first;
  }
  std::map<std::string, Tensor> by_name(unmerged.begin(), unmerged.end());
  const std::vector<double> w = by_name.at("layers.1.ffn.w2.weight").to_f64_vector();
  const Tensor ba = ops::matmul(by_name.at("layers.1.ffn.w2.lora_B").to(DType::f64),
                                by_name.at("layers.1.ffn.w2.lora_A").to(DType::f64));
  const std::vector<double> delta = ba.to_f64_vector();           // B A, scaled by alpha / rank = 2
  EXPECT_GT(*std::max_element(delta.begin(), delta.end()), 0.0);  // the adapter trained
  int checked = 0;
  for (const auto& [name, t] : merged)
    if (name == "layers.1.ffn.w2.weight") {
      const std::vector<double> m = t.to_f64_vector();
      ASSERT_EQ(m.size(), w.size());
      for (size_t i = 0; i < m.size(); ++i) EXPECT_NEAR(m[i], w[i] + 2.0 * delta[i], 1e-6) << i;
      ++checked;
    }
  EXPECT_EQ(checked, 1);

  auto refused = [&](const std::vector<std::pair<const char*, const char*>>& more,
                     const char* what) {
    TrainOptions o;
    for (const auto& [flag, value] : kSmallLlama) set_flag(o, flag, value);
    for (const auto& [flag, value] : more) set_flag(o, flag, value);
    o.schedule.steps = 8;
    o.sample.sample_tokens = 0;
    o.checkpoint = {.ckpt_dir = (tmp.path / "ck").string(), .resume = true};
    try {
      Trainer t(o, pg);
      ADD_FAILURE() << "not refused: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused({{"--lora-rank", "4"},
           {"--lora-alpha", "8"},
           {"--lora-targets", "q,v,o,down"},
           {"--seed", "5"}},
          "base_content");
  refused({}, "lora");

  // A bf16 base (--dtype bf16): the consolidated base is the bf16 one the adapters trained on.
  TrainOptions half;
  for (const auto& [flag, value] : kSmallLlama) set_flag(half, flag, value);
  for (const auto& [flag, value] : std::vector<std::pair<const char*, const char*>>{
           {"--lora-rank", "4"}, {"--dtype", "bf16"}, {"--lr", "1e-2"}})
    set_flag(half, flag, value);
  half.schedule.steps = 2;
  half.sample.sample_tokens = 0;
  half.checkpoint = {.ckpt_dir = (tmp.path / "half").string(), .ckpt_every = 2};
  {
    Trainer t(half, pg);
    t.fit();
  }
  nn::TransformerConfig hc;
  const checkpoint::NamedTensors hb =
      checkpoint::consolidate((tmp.path / "half" / "step_00000002").string(), &hc, false);
  const std::unique_ptr<nn::Transformer> built_half = models::spec_of(hc).build(hc);
  nn::Transformer& fresh_half = *built_half;
  nn::materialize(fresh_half, DType::bf16, 1337);
  int half_checked = 0;
  for (const auto& [name, t] : hb)
    if (!nn::is_lora_parameter(name)) {
      EXPECT_EQ(t.dtype(), DType::bf16) << name;
      EXPECT_EQ(t.to_f64_vector(), fresh_half.parameter(name).data.to_f64_vector()) << name;
      ++half_checked;
    } else {
      EXPECT_EQ(t.dtype(), DType::f32) << name;  // the adapters' masters
    }
  EXPECT_EQ(half_checked, 17);
  dist::destroy_process_group();
}

// The memory plan runs the step on the meta device whatever the planned device: a CUDA run's plan
// (bf16 parameters all-gathered and computed on, f32 masters, 2 shards) is made on a machine
// without a GPU, and counts each block's buffers; planning for 4 shards holds less per rank.
// A loss of a trainer's own, the library's cross-entropy inside, with a buffer of its own from its
// forward to its backward (on the meta device too: the plan must see it); it counts its calls.
class CountingLoss final : public Loss {
 public:
  explicit CountingLoss(int64_t extra) : extra_(extra) {}
  bool fused(const nn::Module& model) const override { return ce_.fused(model); }
  Tensor forward(const Tensor& output, const Tensor& targets, const LossArgs& a) override {
    ++forwards;
    buffer_ = Tensor::empty({extra_}, DType::f32, output.device());
    return ce_.forward(output, targets, a);
  }
  Tensor backward() override {
    buffer_ = Tensor();
    return ce_.backward();
  }
  std::string describe() const override { return "counting cross-entropy"; }
  int64_t forwards = 0;

 private:
  CrossEntropy ce_{false};
  int64_t extra_;
  Tensor buffer_;
};

class ConstantLR final : public optim::Schedule {
 public:
  double at(int64_t) const override { return 5e-3; }
};

// TrainerParts: the Trainer trains with the loss, optimizer, schedule, data and callbacks it is
// handed, and its memory plan plans that loss and that optimizer (the factory is called over the
// plan's meta groups, then over the model's). A part equal to the default gives the default run's
// losses bit for bit; the data named twice (--data and TrainerParts::data) is refused.
TEST(Trainer, TakesItsPartsAndItsPlanPlansThem) {
  TempDir tmp;
  auto pg = dist::init_process_group();
  TrainOptions o;
  for (const auto& [flag, value] : kSmallLlama) set_flag(o, flag, value);
  set_flag(o, "--fused-loss", "false");
  set_flag(o, "--lr", "5e-3");  // the default schedule's constant rate: ConstantLR's
  o.schedule.steps = 3;
  o.sample.sample_tokens = 0;
  o.profile.log_every = 0;
  TrainOptions plain = o;
  plain.profile.log_file = (tmp.path / "plain.jsonl").string();
  {
    Trainer t(plain, pg);
    t.fit();
  }
  auto loss = std::make_shared<CountingLoss>(int64_t(1) << 20);  // 4 MB: the plan's loss term
  std::vector<Device> optimizer_devices;
  int64_t begins = 0, ends = 0;
  TrainOptions given = o;
  given.profile.log_file = (tmp.path / "given.jsonl").string();
  TrainerParts parts{
      .loss = loss,
      .optimizer = [&](std::vector<nn::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
        optimizer_devices.push_back(groups.at(0).params.device());
        return std::make_unique<optim::AdamW>(
            std::move(groups), ops::AdamWHyper{.lr = 5e-3,
                                               .beta1 = o.optimizer.beta1,
                                               .beta2 = o.optimizer.beta2,
                                               .eps = o.optimizer.eps,
                                               .weight_decay = o.optimizer.weight_decay});
      },
      .schedule = std::make_shared<ConstantLR>(),
      .data = std::make_shared<data::RandomTokenSource>(64, o.run.seed),
      .on_step_begin = [&](int64_t) { ++begins; },
      .on_step_end = [&](const profiler::StepMetrics&) { ++ends; }};
  {
    testing::internal::CaptureStdout();
    Trainer t(given, pg, parts);
    const std::string out = testing::internal::GetCapturedStdout();
    EXPECT_NE(out.find("| loss                   | counting cross-entropy"), std::string::npos)
        << out;
    EXPECT_NE(out.find("the caller's (TrainerParts::optimizer)"), std::string::npos) << out;
    t.fit();
  }
  ASSERT_EQ(optimizer_devices.size(), 2u);
  EXPECT_TRUE(optimizer_devices[0].is_meta()) << "the plan's optimizer is the factory's";
  EXPECT_TRUE(optimizer_devices[1].is_cpu());
  EXPECT_EQ(loss->forwards, 2 * 1 + 3);  // the plan's two steps, then the run's three
  EXPECT_EQ(begins, 3);
  EXPECT_EQ(ends, 3);
  const std::vector<double> a = logged_losses(plain.profile.log_file);
  const std::vector<double> b = logged_losses(given.profile.log_file);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t s = 0; s < a.size(); ++s) EXPECT_EQ(a[s], b[s]) << "step " << s;

  // The plan of the same loss: its own buffer is its term.
  nn::TransformerConfig cfg = o.model_config();
  const MemoryPlan with = plan_memory({.model = cfg, .fused_loss = false, .loss = loss.get()});
  const MemoryPlan without = plan_memory({.model = cfg, .fused_loss = false});
  EXPECT_EQ(with.loss, "counting cross-entropy");
  EXPECT_GE(with.loss_bytes, (int64_t(1) << 20) * 4);
  EXPECT_LT(without.loss_bytes, (int64_t(1) << 20) * 4);

  TrainOptions twice = o;
  twice.data.data = (tmp.path / "text.txt").string();
  std::ofstream(twice.data.data) << std::string(4096, 'a');
  EXPECT_NE(error_of([&] { Trainer t(twice, pg, parts); }).find("both name the training data"),
            std::string::npos);
  dist::destroy_process_group();
}

TEST(MemoryPlan, ACudaRunsPlanIsMadeWithoutAGpu) {
  nn::TransformerConfig cfg = nn::TransformerConfig::preset("tiny");
  cfg.arch = nn::Arch::decoder;
  auto plan = [&](int64_t shards) {
    return train::plan_memory({.model = cfg,
                               .device = Device::cuda(0),
                               .shards = shards,
                               .param_dtype = DType::bf16,
                               .reduce_dtype = DType::f32});
  };
  const train::MemoryPlan two = plan(2), four = plan(4);
  EXPECT_GT(two.peak, two.persistent);
  EXPECT_GT(two.persistent, four.persistent);
  EXPECT_EQ(two.persistent, 2 * four.persistent) << "the shards' bytes halve";
  EXPECT_NE(two.at.find("ward of "), std::string::npos) << two.at;  // in the step, not setup
  int64_t terms = 0;
  for (const train::MemoryTerm& t : two.terms) terms += t.bytes;
  EXPECT_EQ(terms, two.peak);
}

// train_loop: evaluation after every eval_every-th step and the last, a checkpoint after every
// save_every-th and the last (the default save: parts.checkpointer with the run), each step's
// metrics to on_step_end with its val_loss; the hooks' order; a loop with no way to save or
// evaluate at an interval is refused by name. (The stop signal's checkpoint: reliability_test and
// async_ckpt_test, through fsdp-train.)
TEST(TrainLoop, EvaluatesAndSavesAtTheirIntervalsAndAfterTheLastStep) {
  TempDir tmp;
  auto world = dist::init_process_group();
  nn::TransformerConfig cfg = nn::TransformerConfig::preset("tiny");
  cfg.dim = 32, cfg.layers = 1, cfg.heads = 4, cfg.vocab = 64, cfg.seq = 16, cfg.batch = 2;
  const models::ModelSpec& spec = models::spec_of(cfg);
  auto model = spec.build(cfg);
  FSDPModule& root = *spec.parallelize(*model, {.fsdp = {.seed = 1}}).root;
  optim::AdamW opt(root.param_groups(0.01), {.lr = 1e-3});
  data::DataLoader data(std::make_shared<data::RandomTokenSource>(cfg.vocab, 1), cfg.batch,
                        world->rank(), world->size(), cfg.seq);
  const checkpoint::RunState run{root, opt, cfg.to_json(), {"arch"}, {{"data", &data}}};
  {  // one Manager a folder at a time
    checkpoint::Manager ckpt({.dir = tmp.str()}, world);
    const train::StepParts parts{*model, root, opt, data, *world, nullptr, &ckpt};
    std::vector<std::string> events;
    train::LoopHooks hooks;
    hooks.on_step_begin = [&](int64_t s, train::StepOptions&) {
      events.push_back("begin " + std::to_string(s));
    };
    hooks.evaluate = [&](int64_t s) {
      events.push_back("eval " + std::to_string(s));
      return double(s);
    };
    hooks.on_step_end = [&](profiler::StepMetrics& m) {
      events.push_back("end " + std::to_string(m.step) +
                       (m.val_loss ? " val " + std::to_string(int(*m.val_loss)) : ""));
    };
    const train::LoopResult r = train::train_loop(
        parts, {.start = 0, .steps = 5, .eval_every = 2, .save_every = 3, .run = &run}, hooks);
    EXPECT_EQ(r.steps_done, 5);
    EXPECT_FALSE(r.stopped);
    const std::vector<std::string> want = {
        "begin 0", "end 0",  "begin 1",     "eval 1",  "end 1 val 1", "begin 2",    "end 2",
        "begin 3", "eval 3", "end 3 val 3", "begin 4", "eval 4",      "end 4 val 4"};
    EXPECT_EQ(events, want);
    std::vector<std::string> saved;
    for (const auto& e : std::filesystem::directory_iterator(tmp.path / "ck"))
      if (e.path().filename().string().starts_with("step_"))
        saved.push_back(e.path().filename().string());
    std::sort(saved.begin(), saved.end());
    EXPECT_EQ(saved, (std::vector<std::string>{"step_00000003", "step_00000005"}));
  }
  // A resume from the newest: its step is the loop's start.
  checkpoint::Manager again({.dir = tmp.str(), .resume = true}, world);
  const auto loaded = again.load(run);
  EXPECT_EQ(loaded ? loaded->step : -1, 5);

  const train::StepParts no_ckpt{*model, root, opt, data, *world};
  EXPECT_THROW(
      {
        try {
          train::train_loop(no_ckpt, {.steps = 1, .save_every = 1});
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("save_every 1 needs a save hook"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  EXPECT_THROW(train::train_loop(no_ckpt, {.steps = 1, .eval_every = 1}), Error);
  dist::destroy_process_group();
}

// The preference losses' dlogits (train/preference.h) against float64 central differences of their
// value, for each kind, with label smoothing where it applies, ignored positions and rows of
// different reply lengths; and DPO's value at a policy equal to its reference is log 2.
TEST(Preference, DlogitsMatchFiniteDifferences) {
  const int64_t rows = 4, seq = 5, vocab = 7;
  std::vector<double> x(size_t(rows * seq * vocab));
  uint64_t state = 12345;
  for (double& v : x) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = double(state >> 11) / double(1ull << 53) * 4.0 - 2.0;
  }
  // Row 0 (chosen) 3 targets, row 1 (rejected) 1, row 2 4, row 3 2; the rest ignored.
  std::vector<int32_t> t(size_t(rows * seq), int32_t(kIgnoreIndex));
  const int64_t count[rows] = {3, 1, 4, 2};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < count[r]; ++k) t[size_t(r * seq + seq - 1 - k)] = int32_t((r + 3 * k) % vocab);
  const Tensor targets = Tensor::from_vector(t, {rows, seq});
  std::vector<int32_t> in(size_t(rows * seq));  // orpo's NLL targets on the chosen rows
  for (size_t i = 0; i < in.size(); ++i) in[i] = int32_t((5 * i + 1) % vocab);
  const Tensor inputs = Tensor::from_vector(in, {rows, seq});
  const std::vector<double> ref{-5.0, -2.5, -7.0, -3.0};
  struct Case {
    train::PreferenceKind kind;
    double smoothing;
  };
  for (const Case c : {Case{train::PreferenceKind::dpo, 0.0}, Case{train::PreferenceKind::dpo, 0.2},
                       Case{train::PreferenceKind::ipo, 0.0}, Case{train::PreferenceKind::simpo, 0.0},
                       Case{train::PreferenceKind::simpo, 0.1},
                       Case{train::PreferenceKind::orpo, 0.0}}) {
    SCOPED_TRACE(train::preference_kind_name(c.kind));
    train::PreferenceLoss loss({.kind = c.kind,
                                .beta = 0.5,
                                .label_smoothing = c.smoothing,
                                .simpo_gamma = 0.3,
                                .reference_adapters_off = false});
    const auto value = [&](const std::vector<double>& v) {
      loss.set_reference(ref);
      loss.set_inputs(inputs);
      const Tensor l = Tensor::from_vector(v, {rows, seq, vocab});
      const double out = loss.forward(l, targets, {.divisor = 0, .scale = 0.25}).to_f64_vector()[0];
      loss.backward();
      return out;
    };
    loss.set_reference(ref);
    loss.set_inputs(inputs);
    const Tensor logits = Tensor::from_vector(x, {rows, seq, vocab});
    loss.forward(logits, targets, {.divisor = 0, .scale = 0.25});
    const std::vector<double> grad = loss.backward().to_f64_vector();
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double h = 1e-6;
      std::vector<double> up = x, down = x;
      up[i] += h, down[i] -= h;
      const double fd = 0.25 * (value(up) - value(down)) / (2 * h);  // d(step) = scale d(loss)
      worst = std::max(worst, std::abs(fd - grad[i]));
    }
    EXPECT_LT(worst, 1e-8);
  }
  // A policy equal to its reference: every DPO pair's loss is log 2, the rewards 0.
  train::PreferenceLoss dpo({.kind = train::PreferenceKind::dpo});
  const Tensor logits = Tensor::from_vector(x, {rows, seq, vocab});
  dpo.set_reference(train::row_target_logps(logits, targets));
  EXPECT_NEAR(dpo.forward(logits, targets, {}).to_f64_vector()[0], std::log(2.0), 1e-15);
  for (double m : {dpo.metrics().to_f64_vector()[0], dpo.metrics().to_f64_vector()[3]})
    EXPECT_EQ(m, 0.0);
  dpo.backward();
}
