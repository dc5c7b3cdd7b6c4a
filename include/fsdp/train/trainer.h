// fsdp-train's training loop as a library piece, in the shape of torchtitan's
// Trainer: options in, a sharded run out. fsdp-train is its command line.
//
//   train::TrainOptions o;            // defaults: the reference script's (train/options.h)
//   o.schedule.steps = 100;
//   o.checkpoint = {.ckpt_dir = "ckpt", .ckpt_every = 50, .resume = true};
//   auto pg = dist::init_process_group({.device = Device::cpu()});
//   train::Trainer trainer(o, pg);    // mesh, data, model, fully_shard, AdamW, resume
//   trainer.fit();                    // the steps, eval, checkpoints, profile, summary
//
// Each rank reads its own rows of a global batch of world_size x batch rows,
// so the data a step sees does not depend on the world size. ShardMode::none
// is the DDP-style baseline (replicate(): replicated parameters, all-reduced gradients).
// A bad option throws fsdp::Error naming the flag and the value.
#pragma once

#include <cstdint>
#include <memory>

#include "fsdp/distributed/process_group.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/train/options.h"

namespace fsdp::train {

// Preemption, as clusters do it: after install_stop_handlers(), the first SIGTERM or SIGINT
// asks every Trainer::fit() to stop after its current step (the ranks agree on it, a checkpoint
// is written when ckpt_dir is set, and fit() returns normally, so the process can exit 0); a
// second one ends the process at once (status 128 + the signal).
void install_stop_handlers();
int stop_signal();  // the signal that asked to stop; 0 when none has

class Trainer {
 public:
  // Collective: every rank of `pg` constructs its Trainer. Builds the mesh, the data, the model
  // (fully_shard per block and on the root), AdamW and the schedule; prints the run's table on
  // rank 0; with resume, loads the newest checkpoint of ckpt_dir.
  Trainer(const TrainOptions& options, std::shared_ptr<dist::ProcessGroup> pg);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs steps start_step() .. steps-1: a step line on rank 0 per step, validation, the JSONL
  // log, checkpoints, the profile window, then the summary line and (after training on data)
  // a sample. Collective.
  void fit();
  int64_t start_step() const;
  int64_t steps_done() const;  // the step fit() stopped after (steps, or earlier on a signal)
  nn::Transformer& model();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::train
