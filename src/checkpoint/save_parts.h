// The three parts of a sharded save (checkpoint.cpp), apart so that AsyncSaver (async_save.cpp)
// can run the middle one on a thread of its own while training goes on:
//   begin_save    collective: rank 0 makes D/.tmp_step_N (an earlier attempt's is removed), then a
//                 barrier, so no rank writes into a folder that is not there yet;
//   write_snapshot this rank's files only, and no collective: its shard file (each rank of the
//                 first replica) and, on rank 0, the extra files, each through AtomicFile
//                 (checked writes, fsync, rename); their checksums, or the error that stopped it;
//   commit_save   collective: every rank's outcome and checksum in one all-gather; a failure on
//                 any rank is an error on every rank (so no rank waits on one that gave up); rank
//                 0 writes metadata.json, then complete.json (its checksum, the seal) last,
//                 renames the folder, fsyncs D and runs the caller's on_commit (the Manager's
//                 retention), all before the closing barrier.
// The snapshot holds everything the save writes, taken at the step boundary: the tensors (live
// ones for a synchronous save, host copies for an asynchronous one), the metadata's fields (the
// optimizer's step count, the data position) and the extra files, so later steps change nothing
// a pending write reads.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/core/tensor.h"

namespace fsdp::checkpoint::detail {

struct SaveSnapshot {
  std::string dir, tmp;  // D and D/.tmp_step_N
  int64_t step = 0;
  int rank = 0, shard = 0, shards = 1, world_size = 1;
  bool first_replica = true;
  std::string run_id;  // in metadata.json and this shard's header
  std::vector<std::pair<std::string, Tensor>> tensors;  // this shard's rows, by name
  nlohmann::json meta;  // rank 0: every field of metadata.json but "files"
  std::vector<std::pair<std::string, std::string>> extra_files;  // rank 0: name -> contents
};

struct WriteResult {
  std::string shard_checksum;                                      // "": no shard written
  std::vector<std::pair<std::string, std::string>> file_checksums;  // rank 0's extra files
  std::exception_ptr error;  // what stopped the write, with the file and errno's words
};

// Copies a flat shard buffer (a parameter group's, or an optimizer state's) to where the write
// reads it from; the identity for a synchronous save.
using StageFn = std::function<Tensor(const Tensor& flat)>;

// Collective: checks the extras (before anything is written), makes the temporary folder.
void begin_save(const std::string& dir, int64_t step,
                const std::shared_ptr<dist::ProcessGroup>& world, const Extras& extras);
// Local: this rank's tensors (through `stage`) and, on rank 0, the metadata's fields.
SaveSnapshot snapshot(const std::string& dir, int64_t step, FSDPModule& root,
                      const optim::Optimizer& opt, const std::string& config_json,
                      const std::shared_ptr<dist::ProcessGroup>& world, const Extras& extras,
                      const StageFn& stage);
// Local, no collective: safe on a thread of its own. A stop request ends the test knob's hold
// (FSDP_CKPT_SLOW_WRITE_MS) early, as an error.
WriteResult write_snapshot(const SaveSnapshot& snap, std::stop_token stop = {});
// Collective. `background` only words the error: a synchronous save rethrows this rank's own
// error as it was; a background one says which step's write failed. `on_commit` runs on rank 0
// once the checkpoint is renamed into place, before the closing barrier (checkpoint.h).
void commit_save(const SaveSnapshot& snap, const WriteResult& mine,
                 const std::shared_ptr<dist::ProcessGroup>& world, bool background,
                 const OnCommit& on_commit);

}  // namespace fsdp::checkpoint::detail
