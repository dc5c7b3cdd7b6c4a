// The machine's fp32 GEMM ceiling, the denominator of MFU. It is measured
// once per (CPU model, thread count) and cached under FSDP_CACHE_DIR, so a
// training run pays for the measurement only the first time.
#pragma once

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"

namespace fsdp::ops {

// Best sgemm FLOP/s on this CPU with `threads` OpenMP threads.
double sgemm_peak_flops(int threads);

// Best GEMM FLOP/s of a CUDA device in `dtype` (cuBLASLt, 8192^3), and its
// device-to-device copy bandwidth in GB/s (read + write). Measured each call.
double device_gemm_peak_flops(Device device, DType dtype);
double device_copy_gbps(Device device);

}  // namespace fsdp::ops
