// A training step's numbers as a trainer reports them, agreed across ranks:
// the mean loss over ranks, the largest rank's peak memory, tokens/s and MFU
// against a FLOP/s ceiling, formatted as fsdp-train's step line and as one
// JSONL object (scripts/plot_loss reads it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fsdp/core/device.h"
#include "fsdp/dist/process_group.h"

namespace fsdp::profiler {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  double step_seconds = 0, tokens_per_s = 0, mfu = 0;  // mfu: a fraction of the ceiling
  double peak_mem_bytes = 0;
  std::optional<double> val_loss;
  // "step 3 | loss 7.1234 | 1234 tok/s | mfu 41.2% | peak mem 0.52 GB | lr 3.0e-04 | grad norm
  // 1.234"
  std::string line() const;
  std::string json() const;  // {"step":3,"loss":...,"val_loss":... when set}
};

struct StepInputs {
  int64_t step = 0;
  double loss = 0;  // this rank's
  double grad_norm = 0, lr = 0, step_seconds = 0;
  int64_t tokens = 0;                          // in the step, over all ranks
  double flops_per_token = 0, peak_flops = 0;  // peak_flops: the ceiling for MFU, all ranks
};

// One small all-gather on `group` (its values on `device`, so NCCL worlds work too): the mean
// loss over ranks and the largest rank's peak memory on `device` (the allocator's high-water
// mark). Collective: every rank calls it each step.
StepMetrics gather_step_metrics(dist::ProcessGroup& group, Device device, const StepInputs& in);

}  // namespace fsdp::profiler
