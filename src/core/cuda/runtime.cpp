// core's CUDA runtime (src/core/gpu.h) in a CUDA build: device count, the
// compute streams (copies, casts and fills: cast_fill.cu), NVTX ranges and the
// profiler's device timing with CUDA events.
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>  // header-only; a no-op unless Nsight is attached

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/trace.h"
#include "src/core/gpu.h"

namespace fsdp::gpu {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

void* compute_stream(int index) {
  static std::mutex mu;
  // Leaked on purpose (no exit-time destructor touches CUDA): streams live for the process.
  static auto* streams = new std::map<int, cudaStream_t>;
  FSDP_CHECK(index >= 0 && index < device_count(), "[device] no CUDA device {} ({} visible)", index,
             device_count());
  std::lock_guard<std::mutex> lock(mu);
  cudaStream_t& s = (*streams)[index];
  if (!s) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(index);
    const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamDefault);
    cudaSetDevice(prev);
    FSDP_CHECK(e == cudaSuccess, "[device] cuda:{}: creating the compute stream failed: {}", index,
               cudaGetErrorString(e));
  }
  return s;
}

DeviceMemoryInfo memory_info(int device) {
  FSDP_CHECK(device >= 0 && device < device_count(), "[device] no CUDA device {} ({} visible)",
             device, device_count());
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  size_t free = 0, total = 0;
  const cudaError_t e = cudaMemGetInfo(&free, &total);
  cudaSetDevice(prev);
  FSDP_CHECK(e == cudaSuccess, "[device] cuda:{}: cudaMemGetInfo failed: {}", device,
             cudaGetErrorString(e));
  return {int64_t(free), int64_t(total)};
}

void* pinned_alloc(int64_t bytes) {
  void* p = nullptr;
  const cudaError_t e =
      cudaHostAlloc(&p, size_t(std::max<int64_t>(bytes, 1)), cudaHostAllocDefault);
  FSDP_CHECK(e == cudaSuccess, "[upload] page-locked host allocation of {} bytes failed: {}", bytes,
             cudaGetErrorString(e));
  return p;
}

void pinned_free(void* p) {
  if (p) cudaFreeHost(p);
}

void* upload_async(void* dst, int device, const void* pinned_src, int64_t bytes) {
  FSDP_CHECK(cudaSetDevice(device) == cudaSuccess, "[upload] cannot select cuda:{}", device);
  auto s = cudaStream_t(compute_stream(device));
  cudaEvent_t done = nullptr;
  cudaError_t e = cudaMemcpyAsync(dst, pinned_src, size_t(bytes), cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(done, s);
  FSDP_CHECK(e == cudaSuccess, "[upload] copying {} bytes to cuda:{} failed: {}", bytes, device,
             cudaGetErrorString(e));
  return done;
}

void upload_wait(void* handle) {
  if (!handle) return;
  auto done = cudaEvent_t(handle);
  const cudaError_t e = cudaEventSynchronize(done);
  cudaEventDestroy(done);
  FSDP_CHECK(e == cudaSuccess, "[upload] waiting for a host-to-device copy failed: {}",
             cudaGetErrorString(e));
}

void download(const std::vector<HostCopy>& copies, int device) {
  if (copies.empty()) return;
  static std::mutex mu;
  // Leaked on purpose, as the compute streams: one side stream per device for the process.
  static auto* side_streams = new std::map<int, cudaStream_t>;
  auto compute = cudaStream_t(compute_stream(device));
  FSDP_CHECK(cudaSetDevice(device) == cudaSuccess, "[download] cannot select cuda:{}", device);
  cudaStream_t side = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    cudaStream_t& s = (*side_streams)[device];
    if (!s) {
      const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      FSDP_CHECK(e == cudaSuccess, "[download] cuda:{}: creating the copy stream failed: {}", device,
                 cudaGetErrorString(e));
    }
    side = s;
  }
  cudaEvent_t ready = nullptr, done = nullptr;
  int64_t total = 0;
  cudaError_t e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ready, compute);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(side, ready, 0);
  for (const HostCopy& c : copies) {
    if (e == cudaSuccess && c.bytes > 0)
      e = cudaMemcpyAsync(c.pinned_dst, c.src, size_t(c.bytes), cudaMemcpyDeviceToHost, side);
    total += c.bytes;
  }
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(done, side);
  if (e == cudaSuccess) e = cudaEventSynchronize(done);
  if (ready) cudaEventDestroy(ready);
  if (done) cudaEventDestroy(done);
  FSDP_CHECK(e == cudaSuccess, "[download] copying {} bytes from cuda:{} to host memory failed: {}",
             total, device, cudaGetErrorString(e));
}

void range_push(const char* name) { nvtxRangePushA(name); }
void range_pop() { nvtxRangePop(); }

namespace {
struct DeviceTimes {
  std::map<int64_t, std::pair<cudaEvent_t, cudaEvent_t>> events;
  cudaEvent_t origin = nullptr;
  int64_t origin_ns = 0;
};
// Leaked on purpose, as the streams: a namespace-scope object with a destructor is destroyed at
// exit, after main (tests/static_resources_test.sh holds files that call CUDA to this).
DeviceTimes& device_times = *new DeviceTimes;
}  // namespace

bool device_timing_begin() {
  if (device_count() == 0) return false;
  int current = 0;
  cudaGetDevice(&current);
  cudaEventCreate(&device_times.origin);
  cudaEventRecord(device_times.origin, cudaStream_t(compute_stream(current)));
  device_times.origin_ns = trace::now_ns();
  trace::set_device_hook([](bool begin, int64_t token, int device) -> int64_t {
    cudaSetDevice(device);
    auto& e = device_times.events[token];
    cudaEvent_t& ev = begin ? e.first : e.second;
    cudaEventCreate(&ev);
    cudaEventRecord(ev, cudaStream_t(compute_stream(device)));
    return 0;
  });
  return true;
}

std::vector<DeviceSpan> device_timing_end() {
  trace::set_device_hook(nullptr);
  std::vector<DeviceSpan> spans;
  if (!device_times.origin) return spans;
  for (auto& [token, ev] : device_times.events) {
    if (!ev.first || !ev.second) continue;
    cudaEventSynchronize(ev.second);
    float a = 0, b = 0;
    cudaEventElapsedTime(&a, device_times.origin, ev.first);
    cudaEventElapsedTime(&b, device_times.origin, ev.second);
    spans.push_back({token, device_times.origin_ns + int64_t(double(a) * 1e6),
                     device_times.origin_ns + int64_t(double(b) * 1e6)});
    cudaEventDestroy(ev.first);
    cudaEventDestroy(ev.second);
  }
  cudaEventDestroy(device_times.origin);
  device_times = DeviceTimes{};
  return spans;
}

}  // namespace fsdp::gpu
