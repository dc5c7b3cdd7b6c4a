// The meta backend of fsdp::ops (src/ops/backend.h): src/ops/cpu_ops.cpp compiled again over
// src/ops/meta_kernels.h, in namespace meta_impl. Its ops make the CPU backend's outputs and
// temporaries on the meta device (fsdp/core/meta.h) and launch nothing, so a step run on meta
// tensors allocates what it would on the CPU, in the same order.
#define FSDP_OPS_META 1
#include "src/ops/cpu_ops.cpp"  // IWYU pragma: keep
