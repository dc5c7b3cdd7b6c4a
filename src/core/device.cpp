// Device names, and whether CUDA is usable in this build on this machine.
#include "fsdp/core/device.h"

#include <charconv>
#include <map>
#include <mutex>
#include <system_error>

#include "fsdp/core/error.h"

#ifdef FSDP_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fsdp {

std::string Device::str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.starts_with("cuda:")) {
    int idx = -1;
    auto rest = s.substr(5);
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), idx);
    if (ec == std::errc() && p == rest.data() + rest.size() && idx >= 0) return Device::cuda(idx);
  }
  FSDP_FAIL("[device] unknown device '{}'; expected cpu, cuda or cuda:N", s);
}

int cuda_device_count() {
#ifdef FSDP_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

void* cuda_compute_stream(int index) {
#ifdef FSDP_WITH_CUDA
  static std::mutex mu;
  static std::map<int, cudaStream_t> streams;  // live for the process, like the device contexts
  FSDP_CHECK(index >= 0 && index < cuda_device_count(), "[device] no CUDA device {} ({} visible)",
             index, cuda_device_count());
  std::lock_guard<std::mutex> lock(mu);
  cudaStream_t& s = streams[index];
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
#else
  FSDP_FAIL("[device] cuda:{}: built without CUDA", index);
#endif
}

}  // namespace fsdp
