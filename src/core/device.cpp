// Device names, and whether CUDA is usable in this build on this machine.
#include "fsdp/core/device.h"

#include <charconv>
#include <system_error>

#include "fsdp/core/error.h"
#include "src/core/gpu.h"

namespace fsdp {

std::string Device::str() const {
  if (is_meta()) return "meta";
  return is_cpu() ? "cpu" : fmt::format("cuda:{}", index);
}

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu();
  if (s == "meta") return Device::meta();
  if (s == "cuda") return Device::cuda(0);
  if (s.starts_with("cuda:")) {
    int idx = -1;
    auto rest = s.substr(5);
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), idx);
    if (ec == std::errc() && p == rest.data() + rest.size() && idx >= 0) return Device::cuda(idx);
  }
  FSDP_FAIL("[device] unknown device '{}'; expected cpu, cuda, cuda:N or meta", s);
}

int cuda_device_count() { return gpu::device_count(); }

bool cuda_available() { return cuda_device_count() > 0; }

void* cuda_compute_stream(int index) { return gpu::compute_stream(index); }
DeviceMemoryInfo cuda_memory_info(int index) { return gpu::memory_info(index); }

}  // namespace fsdp
