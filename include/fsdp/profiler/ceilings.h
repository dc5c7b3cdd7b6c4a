// The machine's GEMM ceilings, the denominator of MFU and of the profiler's
// %peakFL. They are measured once per (CPU model, thread count) or (GPU name,
// dtype) and cached under FSDP_CACHE_DIR (sgemm_peak.json,
// device_gemm_peak.json), so a run pays for the measurement only the first time.
//
// A ceiling is never below a rate a run observes: a measurement taken while the
// machine was busy reads low, and a low peak once cached would stay (MFU read
// 107-131%). So the measurement is the best of several timed repetitions at a
// large square shape and at the model's own GEMM shapes, a rate observed above
// the cached peak raises it (and is written back), and percentages are taken
// against the raised value. Nothing lowers a cached peak but a refresh:
// FSDP_GEMM_PEAK_REMEASURE=1, or deleting the cache file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"

namespace fsdp::profiler {

// C[m, n] = A[m, k] B[k, n]: one of a model's GEMMs.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
};

// Best sgemm FLOP/s on this CPU with `threads` OpenMP threads: the cached value, else the best
// of several repetitions (after a warm-up) at 2048^3 and at `shapes` (rows capped so each takes
// well under a second), cached. FSDP_GEMM_PEAK_GFLOPS overrides it. A cache that is not a JSON
// object of positive numbers is named on stderr and measured again.
double sgemm_peak_flops(int threads, const std::vector<GemmShape>& shapes = {});

// Best GEMM FLOP/s of a CUDA device in `dtype` (cuBLASLt, 8192^3), cached per (GPU name, dtype)
// like the sgemm peak and raised the same way; and its device-to-device copy bandwidth in GB/s
// (read + write), measured each call.
double device_gemm_peak_flops(Device device, DType dtype);
double device_copy_gbps(Device device);

// A GEMM rate a run observed (FLOP/s): when it is above the cached peak for `threads` (or the
// device and dtype), the cache is raised to it and rewritten. Returns the peak now in force,
// max(cached, observed); never lowers the cache. With FSDP_GEMM_PEAK_GFLOPS set nothing is
// written.
double raise_sgemm_peak(int threads, double observed_flops);
double raise_device_gemm_peak(Device device, DType dtype, double observed_flops);

// The cache files, for messages: FSDP_CACHE_DIR (else $XDG_CACHE_HOME/fsdp, ~/.cache/fsdp)
// with sgemm_peak.json or device_gemm_peak.json.
std::string sgemm_peak_cache_path();
std::string device_gemm_peak_cache_path();

}  // namespace fsdp::profiler
