// One optimizer step from a trainer's parts: fsdp-train's step (Trainer::fit calls it), for any
// trainer built from the library. The parts are a caller's: build them as fsdp-train does, or
// replace any one (another model, replicate() for fully_shard, another schedule or loader).
//
//   train::StepParts parts{.model = model, .parallel = root, .optimizer = opt,
//                          .loader = loader, .group = *world, .schedule = &lr};
//   for (int64_t s = start; s < steps; ++s) {
//     profiler::StepMetrics m = train::train_step(parts, s, {.grad_clip = 1.0});
//     if (world->rank() == 0) fmt::print("{}\n", m.line());
//   }
//
// The step waits for the device once (m.host_syncs says how many times it did): the loss, the
// clipping and the metrics stay on the device until one small gather reads them, and a
// non-finite loss or gradient norm throws there, before the optimizer changes a weight.
#pragma once

#include <cstdint>

#include "fsdp/checkpoint/manager.h"
#include "fsdp/data/loader.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/fsdp/data_parallel.h"
#include "fsdp/nn/module.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/optim/optimizer.h"
#include "fsdp/profiler/metrics.h"

namespace fsdp::train {

struct StepParts {
  nn::Module& model;              // rows of tokens [B, T] -> logits [B * T, vocab]
  DataParallelModule& parallel;   // the model's fully_shard root, or replicate()'s
  optim::Optimizer& optimizer;    // over the local shards; clipping covers its groups
  data::DataLoader& loader;       // this rank's rows of each global batch, on the device
  dist::ProcessGroup& group;      // every rank of the run: the metrics' one gather
  const optim::LRSchedule* schedule = nullptr;  // sets the lr of each step; null: left as it is
  // Its background write's state rides in the step's gather (checkpoint::Manager::write_state),
  // so every rank learns at the same step that a write finished or failed. Null: no checkpoints.
  const checkpoint::Manager* checkpointer = nullptr;
};

struct StepOptions {
  int64_t grad_accum = 1;  // microbatches per step, each one loader batch; gradients reduced once
  double grad_clip = 1.0;  // the global norm's bound; <= 0 measures the norm without clipping
  // For tokens/s and MFU: the model's FLOPs per token (forward and backward) and the FLOP/s
  // ceiling of every rank together; 0 reports no MFU.
  double flops_per_token = 0, peak_flops = 0;
  // The head and the loss fused, a chunk of rows at a time (nn::ChunkedLMLoss), where the model
  // fuses_loss(): no [tokens x vocab] logits. false: the model's logits, then nn::LMLoss.
  bool fused_loss = true;
};

// Collective: every rank of parts.group calls it with the same step. Zeroes the gradients, runs
// grad_accum microbatches (forward, the language-model loss, backward; the gradients reduced in
// the last one's backward; with a loader whose source masks targets, the loss is the sum over
// the step's targets on every rank divided by their count, one host all-reduce of the counts),
// clips, gathers the metrics (the mean loss over ranks, the norm, the largest peak memory, a stop
// signal on any rank, the checkpoint writers' state), then steps the optimizer, unless the step
// had no target on any rank (StepMetrics::targets 0: every rank agrees, from the same all-reduce).
// Throws fsdp::Error, before the optimizer step, on a non-finite loss or norm.
profiler::StepMetrics train_step(const StepParts& parts, int64_t step, const StepOptions& options = {});

}  // namespace fsdp::train
