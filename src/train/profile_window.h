// --profile-steps A:B: fsdp-train profiles steps [A, B) and writes each rank's Chrome trace and
// op table to --profile-dir (rank 0 prints its table).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/core/device.h"
#include "fsdp/profiler/profiler.h"
#include "fsdp/train/options.h"

namespace fsdp::train {

class ProfileWindow {
 public:
  ProfileWindow(StepRange steps, std::string dir, int rank, Device device);
  void at_step(int64_t step);  // starts the profiler at A, finishes at B
  void finish();               // writes the trace and table (if profiling); idempotent

 private:
  StepRange steps_;
  std::string dir_;
  int rank_;
  Device device_;
  std::unique_ptr<profiler::Profiler> prof_;
};

}  // namespace fsdp::train
