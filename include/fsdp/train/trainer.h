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
// Any of its parts may be a caller's (TrainerParts): the loss, the optimizer, the schedule, the
// training data and callbacks; the memory plan plans the loss and the optimizer it is given.
//
//   train::Trainer trainer(o, pg, {.loss = std::make_shared<MyLoss>()});
//
// Each rank reads its own rows of a global batch of world_size x batch rows,
// so the data a step sees does not depend on the world size. ShardMode::none
// is the DDP-style baseline (replicate(): replicated parameters, all-reduced gradients).
// A bad option throws fsdp::Error naming the flag and the value.
#pragma once

#include <cstdint>
#include <memory>

#include <functional>

#include "fsdp/data/token_sources.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/optim/optimizer.h"
#include "fsdp/profiler/metrics.h"
#include "fsdp/train/loss.h"
#include "fsdp/train/options.h"

namespace fsdp::train {

// Preemption, as clusters do it: after install_stop_handlers(), the first SIGTERM or SIGINT
// asks every Trainer::fit() to stop after its current step (the ranks agree on it, a checkpoint
// is written when ckpt_dir is set, and fit() returns normally, so the process can exit 0); a
// second one ends the process at once (status 128 + the signal). The signal that asked is
// core/interrupt.h's stop_requested(), the one stop flag that train_step reads.
void install_stop_handlers();

// What a Trainer takes in place of what it would build from TrainOptions; each one left empty is
// built as fsdp-train builds it.
struct TrainerParts {
  // Each microbatch's training loss (train_step's StepParts::loss). Null:
  // CrossEntropy{options.sharding.fused_loss}. Validation stays cross-entropy.
  std::shared_ptr<Loss> loss;
  // The optimizer over the model's parameter groups (the local shards, split by weight decay as
  // options.optimizer says). Null: AdamW with options.optimizer's hyperparameters. A checkpoint
  // saves and restores its state() by name.
  optim::OptimizerFactory optimizer;
  // The learning rate of each step. Null: optim::LRSchedule from options.schedule.
  std::shared_ptr<const optim::Schedule> schedule;
  // The training data the loader hands out, each rank its rows of each global batch. Null:
  // options.data's (random tokens without --data); options.data.eval_every then needs
  // --val-data.
  std::shared_ptr<data::TokenSource> data;
  // Called after fsdp-train's own, on every rank: before each step, and with each step's
  // metrics (agreed over ranks).
  std::function<void(int64_t step)> on_step_begin;
  std::function<void(const profiler::StepMetrics& m)> on_step_end;
};

class Trainer {
 public:
  // Collective: every rank of `pg` constructs its Trainer. Builds the mesh, the data, the model
  // (fully_shard per block and on the root), the optimizer (AdamW) and the schedule, or takes
  // them from `parts`; prints the run's table on rank 0; with resume, loads the newest checkpoint
  // of ckpt_dir.
  Trainer(const TrainOptions& options, std::shared_ptr<dist::ProcessGroup> pg,
          TrainerParts parts = {});
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
