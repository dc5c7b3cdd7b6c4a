// Trainer::Impl::resume: the newest complete checkpoint, and the run's data held to it.
#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/manager.h"
#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/models/spec.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/optim/adamw.h"
#include "src/core/json_read.h"
#include "src/train/trainer_impl.h"

namespace fsdp::train {

namespace {

// --resume: the run's data must be the checkpoint's, by content (data::data_identity: size and
// a hash of every byte; sampled bytes for checkpoints from before), not by path: the same path with
// new contents is refused, a byte-identical copy elsewhere resumes. The training stream's token
// count must match too (--eval-every and
// --val-fraction cut the validation tail off it), or window numbers would name other tokens.
// Checkpoints older than the identity are held to the path, as they were.
void check_same_data(const nlohmann::json& saved, const nlohmann::json& now,
                     const std::string& path) {
  using nlohmann::json;
  auto value = [](const json& j, const char* key) { return j.value(key, json()); };
  if (saved.contains("data_content")) {
    // A checkpoint from before the full content hash holds the sampled identity.
    json content = value(now, "data_content");
    if (saved["data_content"].is_string() &&
        saved["data_content"].get<std::string>().find("sample hash") != std::string::npos &&
        now.value("data", json()).is_string())
      content = data::data_identity(now["data"].get<std::string>(), false).str();
    FSDP_CHECK(saved["data_content"] == content,
               "[fsdp-train] --resume: {} was trained on other data: it was saved with --data {} "
               "holding {} but --data {} holds {}; resume with the data it was trained on, or "
               "start a new --ckpt-dir",
               path, value(saved, "data").dump(), saved["data_content"].dump(),
               value(now, "data").dump(), content.dump());
  }
  // Packed or not: the position counts packed rows, or samples (older checkpoints: not packed).
  FSDP_CHECK(saved.value("pack", false) == now.value("pack", false),
             "[fsdp-train] --resume: {} was saved {} --pack; its position counts {}, so resume "
             "{} --pack, or start a new --ckpt-dir",
             path, saved.value("pack", false) ? "with" : "without",
             saved.value("pack", false) ? "packed rows" : "samples or windows",
             saved.value("pack", false) ? "with" : "without");
  const bool by_path = !saved.contains("data_content");
  for (const char* key :
       {"seq", "data", "data_tokens", "data_samples", "data_rows", "tokenizer_hash"})
    if (saved.contains(key) && (by_path || std::string_view(key) != "data"))
      FSDP_CHECK(saved[key] == value(now, key),
                 "[fsdp-train] --resume: {} was saved with {} {} but this run has {} {}: resume "
                 "with the same data, validation split, sequence length and tokenizer, or start a "
                 "new --ckpt-dir",
                 path, key, saved[key].dump(), key, value(now, key).dump());
}

// The flags whose values differ from the checkpoint's run ("--lr 0.0003 -> 0.001, ..."), the ones
// every resume changes left out; "" when none, or when the checkpoint predates the saved flags.
std::string changed_flags(const nlohmann::json& saved, const nlohmann::json& now) {
  if (!saved.contains("flags") || !saved["flags"].is_object()) return "";
  std::string out;
  for (const auto& [flag, value] : now["flags"].items()) {
    if (flag == "--resume" || flag == "--overwrite") continue;
    const nlohmann::json was = saved["flags"].value(flag, nlohmann::json());
    if (was != value)
      out += fmt::format("{}{} {} -> {}", out.empty() ? "" : ", ", flag,
                         was.is_string() ? was.get<std::string>() : was.dump(),
                         value.get<std::string>());
  }
  return out;
}

// The windows a checkpoint's run had read over all its ranks, from checkpoints before the loader's
// state (part "data") was saved: the loader's batch index, which counts global batches of the
// saved batch x world_size rows. *note says so.
int64_t windows_read(const checkpoint::Loaded& loaded, const nlohmann::json& saved_config,
                     const std::string& path, std::string* note) {
  auto count = [&](const char* key) -> int64_t {
    const nlohmann::json v = saved_config.value(key, nlohmann::json());
    FSDP_CHECK(v.is_number_integer() && v.get<int64_t>() > 0,
               "[fsdp-train] --resume: {} saved its data position as batch {} but its config has "
               "no {} (got {}) to say how many rows a batch held, so the next unread window is "
               "unknown; start a new --ckpt-dir",
               path, loaded.data_position, key, v.dump());
    return v.get<int64_t>();
  };
  const int64_t rows = count("batch") * count("world_size");
  *note = fmt::format(
      "an older checkpoint: its data position is batch {} of {} x {} rows, window {}",
      loaded.data_position, count("batch"), count("world_size"), loaded.data_position * rows);
  return loaded.data_position * rows;
}

// A checkpoint written before configs named their family has no "family" key, where this run's
// config names one: it is of the family whose options its config holds (models::named_config),
// compared with this run's here, by name, and the key is left out of those checkpoint::load
// compares (null against the name would refuse every such checkpoint). A checkpoint that names
// its family is compared by the key, in the load. `path` is the checkpoint the load takes
// (checkpoint::latest, as checkpoint::Manager's resume); a metadata.json that cannot be read
// here is left to the load, which refuses it by name. Each rank reads its own view of the
// folder, so the ranks agree before any refuses (one refusing alone would leave the others in
// the load's collectives) and leave the key out only where all of them would.
void hold_unnamed_family(const std::string& path, const nn::TransformerConfig& run,
                         std::vector<std::string>& model_keys, dist::ProcessGroup& pg) {
  std::string refusal;
  bool hold = false;
  if (!path.empty() && !run.family.empty()) {
    const std::string meta = (std::filesystem::path(path) / "metadata.json").string();
    std::string saved_family;
    try {
      const nlohmann::json saved = json_read::parse_file(meta, "[fsdp-train]").at("config");
      if (saved.is_object() && !saved.contains("family"))
        saved_family = models::named_config(nn::TransformerConfig::from_json(saved.dump())).family;
    } catch (const std::exception&) {
      saved_family.clear();
    }
    // No family holds its options (an experiment of its form): the load compares them, and its
    // null "family" against this run's.
    if (!saved_family.empty() && saved_family != run.family)
      refusal = fmt::format(
          "[fsdp-train] --resume: {} was saved before configs named their family; its options "
          "are the {} family's, but this run trains the {} family: resume with the run's model, "
          "or start a new --ckpt-dir",
          path, saved_family, run.family);
    hold = !saved_family.empty() && saved_family == run.family;
  }
  Tensor votes = Tensor::from_vector<int32_t>({refusal.empty() ? 0 : 1, hold ? 0 : 1}, {2});
  pg.all_reduce(votes, dist::ReduceOp::SUM)->wait();  // a host tensor: no device wait
  const int32_t* v = votes.data<int32_t>();
  FSDP_CHECK(v[0] == 0, "{}",
             refusal.empty() ? fmt::format("[fsdp-train] --resume: another rank refused {} (its "
                                           "family is not this run's); see its message",
                                           path)
                             : refusal);
  if (v[1] == 0) std::erase(model_keys, "family");
}

}  // namespace

// The newest complete checkpoint, as checkpoint::Manager picks and loads it (newer incomplete
// ones skipped aloud, every rank loaded before any goes on); then the run's data fields (seq,
// data, tokenizer) must match the checkpoint's.
checkpoint::RunState Trainer::Impl::run_state() {
  std::vector<std::string> model_keys(family->shape_keys.begin(), family->shape_keys.end());
  // The family first, whatever this run's is: a checkpoint of another family is refused by its
  // name, before any option of it (one written before configs named theirs: hold_unnamed_family,
  // at the resume).
  std::erase(model_keys, "family");
  model_keys.insert(model_keys.begin(), "family");
  model_keys.emplace_back("dtype");
  model_keys.emplace_back("base_content");  // LoRA: the frozen base the adapters were trained on
  return {.model = *root,
          .optimizer = *opt,
          .config_json = config_json,
          .model_keys = std::move(model_keys),
          .parts = {{.name = "data", .part = loader.get(), .required = false}}};
}

void Trainer::Impl::resume() {
  checkpoint::RunState run = run_state();
  hold_unnamed_family(checkpoint::latest(o.checkpoint.ckpt_dir), cfg, run.model_keys, *pg);
  const std::optional<checkpoint::Loaded> found = ckpt->load(run);
  if (!found) return;
  const checkpoint::Loaded& loaded = *found;
  const std::string& path = ckpt->loaded_path();
  const nlohmann::json saved = nlohmann::json::parse(loaded.config_json);
  check_same_data(saved, nlohmann::json::parse(config_json), path);
  std::string note;
  const nlohmann::json user = nlohmann::json::parse(loaded.user_json);
  const int64_t windows = user.is_object() && user.contains("data")
                              ? loader->position()  // part "data", restored by the load
                              : windows_read(loaded, saved, path, &note);
  start_step = loaded.step;
  if (!loaded.sealed)
    note += std::string(note.empty() ? "" : "; ") +
            "an older checkpoint (format 1): it has no complete.json, run id or shard "
            "identities to check; its files' checksums and chunks were checked; its run goes "
            "on under a new id";
  loader->set_position(windows);  // the same where part "data" set it
  if (main()) {
    fmt::print(
        "resume: loaded {} (step {}) of run {}; {} windows ({} tokens) read, continuing "
        "at window {}{}\n",
        path, start_step, loaded.run_id.empty() ? "(none recorded)" : loaded.run_id, windows,
        windows * cfg.seq, windows, note.empty() ? "" : " (" + note + ")");
    if (const std::string changed = changed_flags(saved, nlohmann::json::parse(config_json));
        !changed.empty())
      fmt::print("resume: flags changed since the checkpoint: {}\n", changed);
    if (start_step >= o.schedule.steps)
      fmt::print(stderr,
                 "resume: the checkpoint is at step {} and --steps is {}: nothing left to "
                 "train; pass a larger --steps\n",
                 start_step, o.schedule.steps);
  }
}

}  // namespace fsdp::train
