// The target id a loss skips: PyTorch's and Hugging Face's ignore_index. A row whose target is
// kIgnoreIndex adds nothing to a cross-entropy and gets no gradient (fsdp/ops/ops.h); the
// kernels (kernels/cpu, kernels/cuda) and the ops read it from here.
#pragma once

#include <cstdint>

namespace fsdp {

inline constexpr int64_t kIgnoreIndex = -100;

}  // namespace fsdp
