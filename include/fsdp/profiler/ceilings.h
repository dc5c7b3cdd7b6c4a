// The machine's GEMM ceilings, the denominator of MFU. They are measured once
// per (CPU model, thread count) or (GPU name, dtype) and cached under
// FSDP_CACHE_DIR, so a training run pays for the measurement only the first
// time.
#pragma once

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"

namespace fsdp::profiler {

// Best sgemm FLOP/s on this CPU with `threads` OpenMP threads.
double sgemm_peak_flops(int threads);

// Best GEMM FLOP/s of a CUDA device in `dtype` (cuBLASLt, 8192^3), and its
// device-to-device copy bandwidth in GB/s (read + write). The GEMM peak is
// measured once per (GPU name, dtype) and cached under FSDP_CACHE_DIR like the
// sgemm peak (delete device_gemm_peak.json there to re-measure); the copy
// bandwidth is measured each call.
double device_gemm_peak_flops(Device device, DType dtype);
double device_copy_gbps(Device device);

}  // namespace fsdp::profiler
