// Asynchronous checkpoints, in the spirit of PyTorch DCP's async_save and torchtitan's async
// checkpointing: at the step boundary each rank copies its shards (parameters and optimizer
// state) and everything else the save writes (the metadata's fields, the extra files) to host
// buffers, and a writer thread writes them while training goes on. The host copy is the only
// part a step waits for; on CUDA it is a device-to-host copy into page-locked memory on a side
// stream, ended by one event. The buffers are kept for the next save.
//
// The crash-safety protocol is checkpoint::save's: the files go into D/.tmp_step_N, each written
// through AtomicFile (fsynced, renamed), and rank 0 writes metadata.json last and renames the
// folder, once every rank's files are there. The writer threads use no collective (the CPU
// groups have one communication thread, NCCL one stream order, and both are busy with the
// step's own); the ranks agree on the outcome on the main thread, in wait(). A trainer calls
// wait() at the next save (a second save waits for the first), at the end of training and on a
// stop signal, and may call it earlier, at any step boundary where every rank's writer is known
// to be done or one to have failed (state() gathered with the step's metrics, as fsdp-train
// does: no step pays an extra collective). A failed write is an error there, on every rank,
// naming the file and errno where it happened; it is never lost.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/checkpoint/checkpoint.h"

namespace fsdp::checkpoint {

class AsyncSaver {
 public:
  // This rank's writer, as a number a step's metrics can carry.
  enum class WriteState : int { none = 0, writing = 1, written = 2, failed = 3 };

  AsyncSaver();
  // Stops the test knob's hold and joins the writer; a save not committed by wait() stays a
  // .tmp_ folder, which latest() ignores: the previous checkpoint stands.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Collective, with checkpoint::save's arguments. Waits for the save in flight (wait()), makes
  // D/.tmp_step_N, copies this rank's part to host buffers and starts its writer. On return the
  // model and the optimizer may change: the write reads only the copies. `on_commit` runs on
  // rank 0 when wait() commits this save (checkpoint::OnCommit; the Manager's retention).
  void save(const std::string& dir, int64_t step, FSDPModule& root, const optim::Optimizer& opt,
            const std::string& config_json, const std::shared_ptr<dist::ProcessGroup>& world,
            const Extras& extras = {}, OnCommit on_commit = {});
  // This rank's writer, without waiting.
  WriteState state() const;
  // The step of the save started and not yet committed, or -1.
  int64_t pending_step() const;
  // Collective when a save is pending (every rank calls it at the same point); nothing to do
  // otherwise. Joins this rank's writer, then every rank learns every rank's outcome and rank 0
  // commits the checkpoint. Throws on every rank when a write failed: this rank's error names the
  // file and errno; the others name the rank. The checkpoint is then not made.
  void wait();
  // Seconds the last save() held its caller (the host copy, and the wait for the one before).
  double last_blocking_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::checkpoint
