// The CUDA allocator: cudaMalloc with exact byte counters, one per device.
// The caching allocator (per-stream block reuse, no cudaMalloc in the steady
// state) replaces the body of allocate/deallocate with the CUDA backend issue;
// the interface and the counters stay.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <mutex>

#include "fsdp/core/allocator.h"
#include "fsdp/core/error.h"

namespace fsdp {

namespace {

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {}
  void* allocate(size_t nbytes) override {
    void* p = nullptr;
    if (nbytes) {
      cudaSetDevice(device_);
      cudaError_t e = cudaMalloc(&p, nbytes);
      FSDP_CHECK(e == cudaSuccess, "[allocator] cuda:{}: cudaMalloc of {} bytes failed: {}", device_, nbytes,
                 cudaGetErrorString(e));
    }
    int64_t now = current_.fetch_add(int64_t(nbytes)) + int64_t(nbytes);
    int64_t prev = peak_.load();
    while (now > prev && !peak_.compare_exchange_weak(prev, now)) {
    }
    allocations_.fetch_add(1);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr) cudaFree(ptr);
    current_.fetch_sub(int64_t(nbytes));
  }
  MemoryStats stats() const override {
    return {current_.load(), peak_.load(), allocations_.load(), current_.load()};
  }
  void reset_peak() override { peak_.store(current_.load()); }

 private:
  int device_;
  std::atomic<int64_t> current_{0}, peak_{0}, allocations_{0};
};

}  // namespace

Allocator& cuda_allocator(int device) {
  static std::array<CudaAllocator*, 64> allocators{};
  static std::mutex mu;
  FSDP_CHECK(device >= 0 && device < 64, "[allocator] bad CUDA device index {}", device);
  std::lock_guard<std::mutex> lock(mu);
  if (!allocators[device]) allocators[device] = new CudaAllocator(device);  // lives for the process
  return *allocators[device];
}

}  // namespace fsdp
