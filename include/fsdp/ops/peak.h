// The machine's fp32 GEMM ceiling, the denominator of MFU. It is measured
// once per (CPU model, thread count) and cached under FSDP_CACHE_DIR, so a
// training run pays for the measurement only the first time.
#pragma once

namespace fsdp::ops {

// Best sgemm FLOP/s on this CPU with `threads` OpenMP threads.
double sgemm_peak_flops(int threads);

}  // namespace fsdp::ops
