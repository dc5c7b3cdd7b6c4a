// The meta backend's mixture-of-experts combine (src/ops/backend.h): src/ops/moe_cpu_ops.cpp
// compiled again over src/ops/meta_kernels.h, as src/ops/meta_ops.cpp does for the other ops.
#define FSDP_OPS_META 1
#include "src/ops/moe_cpu_ops.cpp"  // IWYU pragma: keep
