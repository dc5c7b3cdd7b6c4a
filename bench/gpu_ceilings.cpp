// fsdp-bench-gpu: the GPU's ceilings for the roofline and MFU: the bf16 and
// f32 GEMM rate (cuBLASLt, 8192^3) and the device-to-device copy bandwidth
// (bytes read + written), measured once per call.
#include <cstdio>

#include "fsdp/core/device.h"
#include "fsdp/core/error.h"
#include "fsdp/profiler/ceilings.h"

int main() {
  using namespace fsdp;
  try {
    FSDP_CHECK(cuda_available(), "[fsdp-bench-gpu] no CUDA device");
    const Device d = Device::cuda(0);
    fmt::print(
        "gpu-ceilings: bf16 GEMM {:.1f} TFLOP/s | f32 GEMM {:.1f} TFLOP/s | D2D copy {:.0f} GB/s\n",
        profiler::device_gemm_peak_flops(d, DType::bf16) / 1e12,
        profiler::device_gemm_peak_flops(d, DType::f32) / 1e12, profiler::device_copy_gbps(d));
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "fsdp-bench-gpu: error: {}\n", e.what());
    return 1;
  }
}
