// The CUDA backend of fsdp::ops in a build without CUDA (MLX's no_gpu): every
// op of src/ops/backend.h throws, naming itself. ops.cpp sends a tensor here
// only when it is on a CUDA device, after the op's own checks.
#include <cstdint>
#include <string>
#include <vector>

#include "src/ops/backend.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

namespace fsdp::ops::cuda_impl {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  FSDP_FAIL(
      "[{}] no CUDA in this build: fsdp.cpp was configured without a CUDA compiler "
      "(FSDP_CUDA=OFF or none found); move the tensors to the CPU or rebuild with CUDA",
      op);
}
}  // namespace

#define FSDP_NO_CUDA_OP(ret, name, params) \
  ret name params { no_cuda(#name); }
FSDP_BACKEND_OPS(FSDP_NO_CUDA_OP)
#undef FSDP_NO_CUDA_OP

double gemm_peak_flops(Device device, DType dtype) { no_cuda("gemm_peak_flops"); }
double copy_gbps(Device device) { no_cuda("copy_gbps"); }
std::string device_name(Device device) { no_cuda("device_name"); }
std::string attention_path(Device, DType, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                           int64_t) {
  no_cuda("attention_path");
}

}  // namespace fsdp::ops::cuda_impl
