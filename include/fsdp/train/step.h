// One optimizer step from a trainer's parts, and the loop of them: fsdp-train's step and loop
// (Trainer::fit runs train_loop), for any trainer built from the library. The parts are a caller's:
// build them as fsdp-train does, or replace any one (another model, replicate() for fully_shard,
// another schedule, loader or loss: the step calls the loss it is given, so a new loss never
// means copying the step).
//
//   train::StepParts parts{.model = model, .parallel = root, .optimizer = opt,
//                          .loader = loader, .group = *world, .schedule = &lr};
//   for (int64_t s = start; s < steps; ++s) {
//     profiler::StepMetrics m = train::train_step(parts, s, {.grad_clip = 1.0});
//     if (world->rank() == 0) fmt::print("{}\n", m.line());
//   }
//
// A loss of the trainer's own (train/loss.h) goes in the parts; the step calls it in place of
// cross-entropy (examples/custom_trainer/zloss.cpp: cross-entropy plus PaLM's z-loss):
//
//   ZLoss zloss;                   // a train::Loss: forward(logits, targets, args), backward()
//   parts.loss = &zloss;
//
// or the whole loop, with evaluation, checkpoints and a stop signal handled as fsdp-train does:
//
//   const auto print = [](const profiler::StepMetrics& m) { fmt::print("{}\n", m.line()); };
//   train::train_loop(parts, {.start = start, .steps = 100, .save_every = 50, .run = &run},
//                     {.on_step_end = print});
//
// The step waits for the device once (m.host_syncs says how many times it did): the loss, the
// clipping and the metrics stay on the device until one small gather reads them, and a
// non-finite loss or gradient norm throws there, before the optimizer changes a weight.
#pragma once

#include <cstdint>
#include <functional>

#include "fsdp/checkpoint/manager.h"
#include "fsdp/data/loader.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/fsdp/data_parallel.h"
#include "fsdp/nn/module.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/optim/optimizer.h"
#include "fsdp/profiler/metrics.h"
#include "fsdp/train/loss.h"

namespace fsdp::train {

struct StepParts {
  nn::Module& model;              // rows of tokens [B, T] -> logits [B * T, vocab]
  DataParallelModule& parallel;   // the model's fully_shard root, or replicate()'s
  optim::Optimizer& optimizer;    // over the local shards; clipping covers its groups
  data::DataLoader& loader;       // this rank's rows of each global batch, on the device
  dist::ProcessGroup& group;      // every rank of the run: the metrics' one gather
  const optim::Schedule* schedule = nullptr;  // sets the lr of each step; null: left as it is
  // Its background write's state rides in the step's gather (checkpoint::Manager::write_state),
  // so every rank learns at the same step that a write finished or failed. Null: no checkpoints.
  // train_loop saves through it and commits its background writes.
  checkpoint::Manager* checkpointer = nullptr;
  // Each microbatch's loss over the model's output (train/loss.h): a trainer's own (the z-loss
  // of examples/custom_trainer/zloss.cpp). Null: CrossEntropy{StepOptions::fused_loss}.
  Loss* loss = nullptr;
};

struct StepOptions {
  int64_t grad_accum = 1;  // microbatches per step, each one loader batch; gradients reduced once
  double grad_clip = 1.0;  // the global norm's bound; <= 0 measures the norm without clipping
  // For tokens/s and MFU: the model's FLOPs per token (forward and backward) and the FLOP/s
  // ceiling of every rank together; 0 reports no MFU.
  double flops_per_token = 0, peak_flops = 0;
  // The default loss (StepParts::loss null), CrossEntropy's: the head and the loss fused, a
  // chunk of rows at a time (nn::ChunkedLMLoss), where the model fuses_loss(): no [tokens x
  // vocab] logits. false: the model's logits, then nn::LMLoss.
  bool fused_loss = true;
};

// Collective: every rank of parts.group calls it with the same step. Zeroes the gradients, runs
// grad_accum microbatches (forward, parts.loss (train/loss.h; null: cross-entropy), backward;
// the gradients reduced in the last one's backward; with a loader whose source masks targets,
// the loss is the sum over the step's targets on every rank divided by their count, one host
// all-reduce of the counts), clips, gathers the metrics (the mean loss over ranks, the norm, the
// largest peak memory, a stop request on any rank (core/interrupt.h's stop_requested(): the one
// stop flag), the checkpoint writers' state), then steps the optimizer, unless the step had no
// target on any rank (StepMetrics::targets 0: every rank agrees, from the same all-reduce).
// Throws fsdp::Error, before the optimizer step, on a non-finite loss or norm.
profiler::StepMetrics train_step(const StepParts& parts, int64_t step, const StepOptions& options = {});

struct LoopOptions {
  int64_t start = 0;  // the first step (a resume's loaded step)
  int64_t steps = 0;  // the loop ends after step steps - 1
  StepOptions step;
  // LoopHooks::evaluate, and a checkpoint, after every N-th step and after the last; 0: never.
  int64_t eval_every = 0, save_every = 0;
  // What parts.checkpointer saves (the default save). Null: no default save.
  const checkpoint::RunState* run = nullptr;
};

// What a trainer adds to the loop. Each may be empty.
struct LoopHooks {
  // Before each step; may change the step's options (a FLOP/s ceiling raised by the last step).
  std::function<void(int64_t step, StepOptions& options)> on_step_begin;
  // The validation loss, at an evaluation step: it becomes the step's StepMetrics::val_loss.
  std::function<double(int64_t step)> evaluate;
  // After each step and its evaluation: its metrics, agreed over ranks (print, log, TensorBoard).
  std::function<void(profiler::StepMetrics& m)> on_step_end;
  // Writes the checkpoint after `steps_done` steps, replacing the default
  // parts.checkpointer->save(steps_done, *options.run) (a trainer's extras, its messages).
  std::function<void(int64_t steps_done)> save;
  // Commits parts.checkpointer's pending background write, replacing its wait() (a trainer's
  // messages); `stopping`: before the loop ends on a stop signal.
  std::function<void(bool stopping)> commit;
  // After a stop signal's step and its checkpoint, before the loop returns.
  std::function<void(const profiler::StepMetrics& m)> on_stop;
};

struct LoopResult {
  int64_t steps_done = 0;  // options.steps, or fewer after a stop signal
  bool stopped = false;    // a stop signal ended it (install_stop_handlers)
};

// Collective: steps options.start .. options.steps - 1, each a train_step, then, in this order,
// the evaluation (at its interval), on_step_end, a background write that finished committed
// (parts.checkpointer's; its failure thrown on every rank, after that step is logged), the
// checkpoint (at its interval).
// A stop signal ends the loop after the step every rank agreed on (StepMetrics::stop), with a
// checkpoint when one can be written (a save hook, or parts.checkpointer with options.run) and
// none was at that step, the background write committed, then on_stop; the stop's grace does not
// interrupt their waits (a second signal ends the process). Before returning, a background write
// still in flight is committed. Throws fsdp::Error on save_every > 0 with no way to save, or on a
// step's error (train_step's).
LoopResult train_loop(const StepParts& parts, const LoopOptions& options,
                      const LoopHooks& hooks = {});

}  // namespace fsdp::train
