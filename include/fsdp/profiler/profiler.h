// The profiler: torch.profiler's macro view and Nsight Compute's Speed of
// Light verdict, built in.
//
//   profiler::Profiler prof({.record_shapes = true, .profile_memory = true});
//   prof.start();  ... train ... prof.stop();
//   prof.export_chrome_trace("trace.json");           // Perfetto, chrome://tracing
//   fmt::print("{}", prof.key_averages().table("cpu_time_total", 10));
//
// Every op, collective, allocation and FSDP phase records itself (see
// fsdp/core/trace.h); with the profiler off that costs a branch per op. Each
// op's achieved FLOP/s and bytes/s are set against the machine's measured
// ceilings (GEMM peak, copy bandwidth) and classed with the reference
// article's thresholds: compute over 75% of peak is compute-bound; compute
// under 25% with memory over 75% is memory-bound; anything else keeps
// neither unit busy and is latency/launch-bound.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/core/trace.h"

namespace fsdp::profiler {

enum class Activity { CPU, CUDA };

struct Schedule {
  int wait = 0, warmup = 0, active = 1;  // steps, advanced by Profiler::step()
};

struct ProfilerOptions {
  std::vector<Activity> activities = {Activity::CPU};
  bool record_shapes = false;
  bool profile_memory = false;
  std::optional<Schedule> schedule;
  int rank = 0;  // the trace's process id
};

// The machine's ceilings: GEMM FLOP/s and copy bandwidth (bytes read + written per second).
struct Ceilings {
  double flops = 0, bytes_per_s = 0;
};
// CPU ceilings with the current OpenMP threads, measured once and cached
// (FSDP_CACHE_DIR), like the MFU denominator (profiler/ceilings.h). key_averages()
// raises a GEMM ceiling that an op's observed rate exceeds, so no %peakFL is
// above 100.
Ceilings cpu_ceilings();
// A GPU's ceilings for ops of one dtype: the cuBLASLt GEMM rate in that dtype
// (bf16 for bf16 and f16) on random operands and the device-to-device copy
// bandwidth, measured once per process and device.
Ceilings cuda_ceilings(int device, const std::string& dtype);

struct KeyAverage {
  std::string name, shapes, category;
  std::string device, dtype;  // of the op's first call: the ceilings it is set against
  int64_t calls = 0;
  double cpu_total_us = 0, self_cpu_us = 0, device_us = 0;
  double flops = 0, bytes = 0;  // totals over the calls
  double flops_per_s = 0, bytes_per_s = 0, pct_compute = 0, pct_bandwidth = 0;
  std::string verdict, remedy;
};

class KeyAverages {
 public:
  std::vector<KeyAverage> rows;
  double self_cpu_total_us = 0;
  // One line per device whose GEMM peak an op's observed rate raised (and wrote to the cache):
  // the op, its rate and the peak it replaced. The table prints them.
  std::vector<std::string> peak_notes;
  // Sorted by cpu_time_total, self_cpu_time_total, device_time_total, calls or flops.
  std::string table(const std::string& sort_by = "cpu_time_total", int row_limit = 10) const;
};

// The verdict for an op and the article's remedy for it.
std::string classify(double pct_compute, double pct_bandwidth, std::string* remedy);

class Profiler {
 public:
  explicit Profiler(ProfilerOptions opt = {});
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  void start();
  void stop();
  void step();  // the next schedule step
  bool collecting() const;

  const std::vector<trace::Record>& records() const { return records_; }
  void export_chrome_trace(const std::string& path) const;
  KeyAverages key_averages(bool group_by_input_shape = false) const;
  // Time in collectives on the communication threads, and the part the
  // compute thread spent waiting for them (not hidden behind compute).
  std::string overlap_summary() const;

 private:
  void begin_recording();
  void end_recording(bool keep);
  ProfilerOptions opt_;
  std::vector<trace::Record> records_;
  std::vector<std::string> thread_names_;
  int64_t t0_ns_ = 0;
  int step_ = 0;
  bool recording_ = false;
  bool device_timing_ = false;  // CUDA events are being recorded
  Ceilings ceilings_;           // the CPU's; CUDA ops use cuda_ceilings()
  int ceilings_threads_ = 1;    // the OpenMP threads ceilings_ were measured with
};

// A user annotation over a scope, like torch.profiler.record_function.
class RecordFunction {
 public:
  explicit RecordFunction(const std::string& name)
      : scope_(name.c_str(), trace::Kind::annotation) {}

 private:
  trace::Scope scope_;
};

}  // namespace fsdp::profiler
