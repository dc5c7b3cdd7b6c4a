// A training step's numbers as a trainer reports them, agreed across ranks:
// the mean loss over ranks, the largest rank's peak memory, tokens/s and MFU
// against a FLOP/s ceiling, formatted as fsdp-train's step line and as one
// JSONL object (scripts/plot_loss.py reads it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/tensor.h"
#include "fsdp/distributed/process_group.h"

namespace fsdp::profiler {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  double step_seconds = 0, tokens_per_s = 0, mfu = 0;  // mfu: a fraction of the ceiling
  double peak_mem_bytes = 0;
  std::optional<double> val_loss;
  bool stop = false;        // some rank was asked to stop (StepInputs::stop), agreed by all
  // The ranks' background checkpoint writers (StepInputs::ckpt_write), agreed by all: some rank's
  // failed; some rank's is still writing.
  bool ckpt_write_failed = false, ckpt_writing = false;
  int64_t host_syncs = -1;  // the step's host waits (core's host_sync_count), when counted
  // The step's targets over all ranks, when the data masks some (-1: every position is one). At 0
  // the optimizer does not step: there is nothing to learn from, and AdamW's moments and weight
  // decay would still move the weights.
  int64_t targets = -1;
  // This rank's seconds in the step's collectives on their threads, and the compute thread's wait
  // for them (the communication compute did not hide).
  double comm_seconds = 0, exposed_seconds = 0;
  // The bytes this rank's all-gathers wrote in the step (every rank's shards of each group).
  int64_t all_gather_bytes = 0;
  // The run's time so far and the time left (the mean of the recent steps times those left),
  // when the trainer set them (< 0: not).
  double elapsed_seconds = -1, eta_seconds = -1;
  // A loss's own values (StepInputs::metric_names: a preference loss's rewards/margins, ...), each
  // the mean over the step's microbatches and ranks, in the step line, its JSON and TensorBoard.
  std::vector<std::pair<std::string, double>> named;
  // "step 3 | loss 7.1234 | 1234 tok/s | mfu 41.2% | peak mem 0.52 GB | lr 3.0e-04 | grad norm
  // 1.234 | elapsed 12s | eta 3m12s"
  std::string line() const;
  std::string json() const;  // {"step":3,"loss":...,"val_loss":... when set}
};

// A duration as the step line shows it: "42s", "3m12s", "2h05m".
std::string short_duration(double seconds);

struct StepInputs {
  int64_t step = 0;
  double loss = 0;  // this rank's, when `losses` is empty
  // This rank's microbatch losses as device scalars: the rank's loss is their mean, read in the
  // same gather as the rest, so the step needs no host read of its own for them.
  std::vector<Tensor> losses;  // one per microbatch: f64, its elements' sum the loss
  // A loss's named values: per microbatch, f64 [metric_names.size()] on the device (none: empty).
  std::vector<std::string> metric_names;
  std::vector<Tensor> metrics;
  double grad_norm = 0;
  Tensor grad_norm_sq;  // when defined: the global squared norm on the device; grad_norm = sqrt
  bool stop = false;    // this rank was asked to stop; every rank learns it from the gather
  // This rank's background checkpoint writer, checkpoint::AsyncSaver::WriteState as a number
  // (0 none, 1 writing, 2 written, 3 failed); every rank learns every rank's from the gather.
  int ckpt_write = 0;
  double lr = 0, step_seconds = 0;
  int64_t tokens = 0;                          // in the step, over all ranks
  double flops_per_token = 0, peak_flops = 0;  // peak_flops: the ceiling for MFU, all ranks
};

// One small all-gather on `group` (its values on `device`, so NCCL worlds work too) and one host
// read: the mean loss over ranks, the grad norm, the largest rank's peak memory on `device` (the
// allocator's high-water mark) and whether any rank was asked to stop. The values are put on the
// device by copies and fills on its stream, so this is the step's only host sync. Collective:
// every rank calls it each step.
StepMetrics gather_step_metrics(dist::ProcessGroup& group, Device device, const StepInputs& in);

}  // namespace fsdp::profiler
