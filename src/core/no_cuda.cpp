// core's CUDA runtime (src/core/gpu.h) in a build without CUDA: no device is
// visible, NVTX ranges and device timing do nothing, and anything that needs a
// device throws, naming what asked for it.
#include <cstdint>
#include <vector>

#include "fsdp/core/error.h"
#include "src/core/gpu.h"

namespace fsdp::gpu {

namespace {
[[noreturn]] void no_cuda(const char* what, int device) {
  FSDP_FAIL(
      "[{}] cuda:{}: no CUDA in this build (fsdp.cpp was configured without a CUDA "
      "compiler); use the CPU or rebuild with CUDA",
      what, device);
}
}  // namespace

int device_count() { return 0; }
void* compute_stream(int device) { no_cuda("device", device); }
Allocator& allocator(int device) { no_cuda("allocator", device); }
DeviceMemoryInfo memory_info(int device) { no_cuda("memory_info", device); }
void memcpy_sync(void*, Device dst_device, const void*, Device src_device, int64_t) {
  no_cuda("Tensor::copy_", dst_device.is_cuda() ? dst_device.index : src_device.index);
}
void* pinned_alloc(int64_t) { no_cuda("pinned_alloc", 0); }
void pinned_free(void*) {}
void* upload_async(void*, int device, const void*, int64_t) { no_cuda("upload", device); }
void upload_wait(void*) {}
void download(const std::vector<HostCopy>&, int device) { no_cuda("download", device); }
void cast(void*, DType, const void*, DType, int64_t, int device) {
  no_cuda("Tensor::copy_", device);
}
void fill(void*, DType, int64_t, double, int device) { no_cuda("Tensor::fill_", device); }
void range_push(const char*) {}
void range_pop() {}
bool device_timing_begin() { return false; }
std::vector<DeviceSpan> device_timing_end() { return {}; }

}  // namespace fsdp::gpu
