// A device is "cpu", "cuda:N" or "meta". Tensors carry one; ops dispatch on it. A meta tensor
// has a shape and a dtype and no storage (fsdp/core/meta.h): the memory plan runs the real step on
// such tensors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace fsdp {

struct Device {
  enum class Type : uint8_t { cpu, cuda, meta };
  Type type = Type::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {Type::cuda, i}; }
  static Device meta() { return {Type::meta, 0}; }
  bool is_cpu() const { return type == Type::cpu; }
  bool is_cuda() const { return type == Type::cuda; }
  bool is_meta() const { return type == Type::meta; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

// Parses "cpu", "cuda", "cuda:N" or "meta"; throws on anything else.
Device parse_device(std::string_view s);

// True when this build has CUDA and at least one device is visible.
bool cuda_available();
int cuda_device_count();

// The stream (a cudaStream_t) on which every CUDA op of this process runs on device `index`:
// made once per device, never the legacy default stream. It is a blocking stream, so the
// runtime's own legacy-stream work (cudaMemcpy to the host, memsets) stays ordered with it.
// Throws in a build without CUDA.
void* cuda_compute_stream(int index);

// A CUDA device's free and total memory now (cudaMemGetInfo), bytes: what the memory plan checks
// before the first allocation. Throws in a build without CUDA.
struct DeviceMemoryInfo {
  int64_t free = 0, total = 0;
};
DeviceMemoryInfo cuda_memory_info(int index);

}  // namespace fsdp
