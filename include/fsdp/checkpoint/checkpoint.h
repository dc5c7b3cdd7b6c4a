// Sharded checkpoints of a fully_shard'ed model and its optimizer's state (any optim::Optimizer;
// each state tensor is saved per parameter, under "<state>/<parameter name>").
//
//   D/step_00000100/metadata.json         global shape, dtype, placement and the
//                                          row chunk of every shard file, the run's
//                                          config, the step (= data position and
//                                          RNG state: both are functions of seed and
//                                          step) and a checksum per file
//   D/step_00000100/shard_00000.safetensors  param/<name>, exp_avg/<name>,
//                                          exp_avg_sq/<name>: this shard's rows; its
//                                          header names its shard, the writing rank,
//                                          the world size, the run id and the step
//   D/step_00000100/complete.json         metadata.json's checksum: the seal
//
// Each rank of the first replica writes its own shard file into
// D/.tmp_step_00000100, every file is fsynced, rank 0 writes the metadata,
// then complete.json, last and renames the directory: a crash leaves a .tmp
// directory that latest() ignores, never a half-written checkpoint that looks
// whole. A folder whose complete.json is missing, garbled or does not match
// its metadata.json is incomplete (incomplete_reason); every reader checks the
// whole manifest (chunk coverage, shard files, shard headers) before reading
// a tensor byte (src/checkpoint/manifest.h).
// Loading at another world size reads, for each parameter, the rows this
// rank now owns from whichever old shard files hold them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>  // IWYU pragma: export (Extras::files holds pairs)
#include <vector>

#include "fsdp/distributed/process_group.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/optim/optimizer.h"

namespace fsdp::checkpoint {

// What a trainer saves beside the model and the optimizer.
struct Extras {
  int64_t data_position = -1;    // the data loader's position (windows read); -1: the step
  std::string user_json = "{}";  // any JSON value of the trainer's own, returned by load
  // Small files saved whole beside the shards, by rank 0 (name in the checkpoint directory ->
  // contents), covered by the metadata's checksums: the run's tokenizer.json, for instance.
  std::vector<std::pair<std::string, std::string>> files;
  // The run's id (new_run_id at a fresh start, inherited on resume), in metadata.json and every
  // shard's header: a shard of another run is refused. "": none.
  std::string run_id;
};

// Collective: a new run id, rank 0's ("20261201-234512-9f3a61c2": UTC time and 32 random bits),
// the same on every rank.
std::string new_run_id(const std::shared_ptr<dist::ProcessGroup>& world);

// What the caller does with D once a save is committed, on rank 0 (the rank that renames): called
// with D after D/step_N is in place and D is fsynced, before the save's closing barrier, so every
// rank returns from the save after it. checkpoint::Manager's retention (keep_latest, manager.h)
// runs here; the save itself removes nothing but an earlier attempt at the same step.
using OnCommit = std::function<void(const std::string& dir)>;

// Collective over `world`: the on-disk protocol above, nothing else. `config_json` is a JSON
// object describing the run; its model fields are checked on load.
void save(const std::string& dir, int64_t step, FSDPModule& root, const optim::Optimizer& opt,
          const std::string& config_json, const std::shared_ptr<dist::ProcessGroup>& world,
          const Extras& extras = {}, const OnCommit& on_commit = {});
// The same, then the Manager's retention: keeps the newest `keep` checkpoints (0: all), as
// keep_latest(dir, keep) on rank 0 (manager.h). For callers without a Manager.
void save(const std::string& dir, int64_t step, FSDPModule& root, const optim::Optimizer& opt,
          const std::string& config_json, int keep,
          const std::shared_ptr<dist::ProcessGroup>& world, const Extras& extras = {});

// The newest complete checkpoint directory in `dir`, or "" when there is none.
std::string latest(const std::string& dir);

// Whether `name` is a checkpoint folder's name as save writes it: exactly "step_" and 8 digits
// (with tmp, ".tmp_step_" and 8 digits). Only such folders are loaded, pruned or cleared;
// step_00000004.bak or step_results_for_paper are the user's and left alone.
bool is_step_folder_name(const std::string& name, bool tmp = false);

// Why the checkpoint folder `path` is not complete ("no metadata.json", "no complete.json ...",
// "metadata.json has checksum ... but complete.json records ..."), or "" when it is. A folder of
// format 1 (written before complete.json) is complete here; load says so (Loaded::sealed).
std::string incomplete_reason(const std::string& path);

// Whether the folder `path` holds this project's mark: a complete.json (the seal; a damaged one
// still marks the folder as the project's), or a metadata.json of this project's format (one
// whose seal is missing, or of format 1, from before the seal).
// Retention and --overwrite remove only step folders that hold it: a step_00000003/ the user
// made, with other files, is left alone.
bool holds_project_mark(const std::string& path);

// An extra file of a checkpoint (Extras::files), checked against its checksum; nullopt where
// the checkpoint has none of that name.
std::optional<std::string> read_extra_file(const std::string& path, const std::string& name);

struct Loaded {
  int64_t step = 0;
  std::string config_json;
  int64_t data_position = 0;  // the step, for checkpoints that saved none
  std::string user_json = "{}";
  std::string run_id;   // "": the checkpoint names none
  bool sealed = true;   // false: format 1, written before complete.json and shard identities
};
// Loads `path` into root's shards and the optimizer's state, resharding as
// needed. Refuses, naming the file and the problem, before any tensor byte is read: an
// incomplete folder, chunks that do not cover each tensor exactly, shard files that are not
// exactly 'shards' of them, a checksum that does not match (truncated or corrupted), a shard
// whose header names another shard, checkpoint or run, and a model config
// (`model_keys` of config_json) that differs from the checkpoint's.
Loaded load(const std::string& path, FSDPModule& root, optim::Optimizer& opt,
            const std::string& config_json, const std::vector<std::string>& model_keys);

}  // namespace fsdp::checkpoint
