// Which attention kernel a shape runs on a device, for the run's table.
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"

namespace fsdp::ops {

// On CUDA "cuDNN SDPA (cuDNN 9.19.0 loaded, built against 9.19.0)", or "our kernel (the same
// versions; cuDNN refused the forward of B .. T .. H .. KV .. hd .. bf16 causal: why)" where
// cuDNN refused the shape or the build has none; "our kernel (CPU)" on the CPU. window > 0: a
// causal sliding window's.
std::string attention_path(Device device, DType dtype, int64_t B, int64_t T, int64_t heads,
                           int64_t kv_heads, int64_t head_dim, bool causal, int64_t window = 0);

}  // namespace fsdp::ops
