// checkpoint::Manager: the one owner of a checkpoint folder, shared by fsdp-train (train::Trainer)
// and any trainer written from the library's parts (examples/custom_trainer), in the spirit of
// torchtitan's CheckpointManager. It holds the resume policy, so every trainer gets the same one:
//
//   - one job per folder: rank 0 takes an flock on D/.lock for the Manager's life (the kernel
//     releases it when the process dies, kill -9 included) and records its pid, host and start
//     time there, so a second job is refused naming the holder. Only rank 0 locks: the ranks of
//     one job on a shared filesystem never lock each other out;
//   - one run's lineage per folder: a fresh run (resume = false) into a folder that holds
//     checkpoints is refused by name, unless overwrite clears them first (only the folders this
//     project writes, step_* and .tmp_step_*; other files stay);
//   - resume loads the newest complete checkpoint (checkpoint::latest), says aloud which newer,
//     incomplete ones it skips, refuses step folders of which none is complete, and every rank
//     learns that one could not load before load() returns on any;
//   - saves go through checkpoint::save or, with async, checkpoint::AsyncSaver (the on-disk
//     protocol), each carrying the run's id, new at a fresh start and kept by resumes (its
//     lineage);
//   - retention is the Manager's (torchtitan's keep_latest_k): once each save is committed,
//     rank 0 keeps the newest `keep` complete step folders (keep_latest), before the save's closing
//     barrier; a background save is pruned for when wait() (or the next save) commits it.
// Every decision rank 0 makes about the folder is agreed with one all-reduce, so a refusal is an
// error on every rank (rank 0's names the reason; the others name rank 0).
//
// What a checkpoint holds is a RunState: the sharded model and optimizer, the run's config (its
// model keys checked on resume) and a list of named Stateful parts (a data loader, a trainer's own
// counters), each saved as a JSON value under its name in metadata.json's "user" object:
//
//   checkpoint::RunState run{.model = root, .optimizer = opt, .config_json = cfg.to_json(),
//                            .model_keys = {"arch"}, .parts = {{"data", &loader}}};
//   const auto loaded = manager.load(run);  // the newest complete one, every part restored
//   ...
//   manager.save(step, run);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/core/stateful.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/optim/optimizer.h"

namespace fsdp::checkpoint {

struct ManagerOptions {
  std::string dir;         // D: the run's checkpoint folder (created when missing)
  bool resume = false;     // continue the run in D; false: a fresh run, refused where D holds one
  bool overwrite = false;  // a fresh run clears D's step_* and .tmp_step_* folders first
  int keep = 0;            // the newest checkpoints kept; 0: all
  bool async = false;      // saves are written by a background thread (AsyncSaver)
};

// The Manager's retention, run on rank 0 once a save is committed (checkpoint::OnCommit): keeps
// the newest `keep` complete step_* folders (by step) and removes the older complete ones and the
// incomplete ones older than the oldest kept; 0 keeps all. An incomplete folder newer than that
// (a crashed attempt that a resume skipped, aloud) is left for its owner to look at, and never
// counts, so the checkpoint just committed is always kept. .tmp_step_* folders (writes not
// committed, a background one included) are never touched. A folder that cannot be listed or
// removed is left as it is, with a line on stderr: pruning never fails a save.
void keep_latest(const std::string& dir, int keep);

// Refuses a checkpoint folder `dir` that is the root folder '/' or lies inside another run's
// checkpoint folder (an ancestor that is a step folder with the project's mark, holds such step
// folders, or holds a lock file with a holder's record): that run's keep and overwrite would
// remove this one's checkpoints. The Manager checks it (rank 0) before it creates or locks D; a
// trainer may call it earlier, before it writes anything there.
void check_folder_place(const std::string& dir);

// One named part of a run's state. A required part missing from the checkpoint a resume loads is
// refused by name; an optional one is left as it is (a part newer than the checkpoints of a run).
struct StatePart {
  std::string name;  // its key in metadata.json's "user" object
  Stateful* part = nullptr;
  bool required = true;
};

struct RunState {
  FSDPModule& model;                    // the sharded root: every parameter's shard
  optim::Optimizer& optimizer;          // its state per parameter
  std::string config_json = "{}";       // a JSON object describing the run (checkpoint::save)
  std::vector<std::string> model_keys;  // its keys a resume must match (checkpoint::load)
  std::vector<StatePart> parts;         // distinct names
};

class Manager {
 public:
  // Collective over `world` (nullptr: this process alone). Locks D and applies the fresh-run
  // rule; throws on every rank when either refuses.
  Manager(ManagerOptions options, std::shared_ptr<dist::ProcessGroup> world);
  // Joins a background write not committed by wait() (it stays a .tmp_ folder), then unlocks.
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // The checkpoint a resume loads: the newest complete one, "" when D holds no step folder.
  // Prints (rank 0, stderr) each newer incomplete one it skips; refuses step folders of which
  // none is complete. Local: no collective.
  std::string resume_path() const;
  // Collective. With resume, loads resume_path() into root's shards and the optimizer (see
  // checkpoint::load); nullopt when there is nothing to load (or resume is off). A rank that
  // cannot load makes every rank throw before any returns.
  std::optional<Loaded> load(FSDPModule& root, optim::Optimizer& opt,
                             const std::string& config_json,
                             const std::vector<std::string>& model_keys);
  // The same, then each part of run.parts restored from the checkpoint's "user" object (a missing
  // required part, or one whose load_state_dict refuses its value, fails every rank).
  std::optional<Loaded> load(const RunState& run);
  const std::string& loaded_path() const { return loaded_path_; }
  // The run's id (checkpoint::new_run_id, made at construction; a resume takes the loaded
  // checkpoint's where it names one): stamped on every save whose Extras name none.
  const std::string& run_id() const { return run_id_; }

  // Collective: the checkpoint of `step` into D (checkpoint::save's arguments), synchronous or
  // started in the background (a second save waits for the first); keep_latest(D, keep) once it
  // is committed.
  void save(int64_t step, FSDPModule& root, const optim::Optimizer& opt,
            const std::string& config_json, const Extras& extras = {});
  // The same for a RunState: each part's state_dict() under its name in the "user" object (beside
  // the keys of extras.user_json, an object, which must not reuse a part's name).
  void save(int64_t step, const RunState& run, const Extras& extras = {});
  // The background write's state (AsyncSaver::WriteState as an int; 0 when none), for a step's
  // metrics gather.
  int write_state() const;
  // The step of the background save not yet committed, or -1.
  int64_t pending_step() const;
  // Collective when a background save is pending: commits it (AsyncSaver::wait).
  void wait();
  // Seconds the last background save() held its caller.
  double last_blocking_seconds() const;

  const ManagerOptions& options() const { return o_; }

 private:
  struct Impl;
  ManagerOptions o_;
  std::shared_ptr<dist::ProcessGroup> world_;
  std::string loaded_path_, run_id_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::checkpoint
