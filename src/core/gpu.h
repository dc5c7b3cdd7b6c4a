// The CUDA half of core, behind one interface: src/core/cuda/runtime.cpp and
// src/core/cuda/allocator.cpp in a CUDA build, src/core/no_cuda.cpp otherwise
// (there device_count() is 0, the NVTX ranges and device timing do nothing and
// everything else throws "no CUDA in this build"). Core calls these and never
// includes a CUDA header or a kernel. Private to the library.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/core/allocator.h"
#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"

namespace fsdp::gpu {

int device_count();  // 0 without CUDA or without a visible device
// The device's compute stream (a cudaStream_t): every op's launches go on it.
void* compute_stream(int device);
Allocator& allocator(int device);  // the caching allocator of one device
DeviceMemoryInfo memory_info(int device);  // cudaMemGetInfo: free and total bytes

// Copies bytes between any two of host and devices and waits for them.
void memcpy_sync(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes);
// Page-locked host memory, which the device copies from without the host waiting.
void* pinned_alloc(int64_t bytes);
void pinned_free(void* p);
// Queues a copy of `bytes` from pinned host memory to `dst` on `device`'s compute stream and
// returns at once, with a handle (an event recorded after the copy): upload_wait(handle) blocks
// until the copy has run, so the pinned source may be written again, and releases the handle.
void* upload_async(void* dst, int device, const void* pinned_src, int64_t bytes);
void upload_wait(void* handle);
// Device-to-host copies into page-locked memory on `device`'s side copy stream, after the work
// queued on its compute stream so far; the host waits for the one event recorded after the last
// (an asynchronous checkpoint's host copy).
struct HostCopy {
  void* pinned_dst;
  const void* src;
  int64_t bytes;
};
void download(const std::vector<HostCopy>& copies, int device);
// dst = src, n contiguous elements on `device`, casting the dtype, on its compute stream.
void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n, int device);
void fill(void* dst, DType dtype, int64_t n, double value, int device);

// NVTX ranges, so that Nsight Systems and Nsight Compute show the ops' names.
void range_push(const char* name);
void range_pop();

// Device timing for the profiler: between begin and end, every traced op on a CUDA device gets
// events on its compute stream. end() returns each op's device span, keyed by its trace token,
// in the trace's clock. begin() returns false where there is no device to time.
struct DeviceSpan {
  int64_t token = 0, begin_ns = 0, end_ns = 0;
};
bool device_timing_begin();
std::vector<DeviceSpan> device_timing_end();

}  // namespace fsdp::gpu
