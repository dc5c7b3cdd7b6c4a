// The CUDA caching allocator, one per device. Freed blocks go back to a pool
// keyed by their rounded size and are handed out again, so a training step
// makes no cudaMalloc once the first step has run. Blocks are used by the
// device's compute stream (cuda_compute_stream), so a block freed and reused
// is ordered on that stream; collectives on other streams keep
// their tensors alive until the compute stream has waited for them (see
// src/distributed/nccl). Counters: allocated (current, peak), the "peak mem" of
// fsdp-train, and reserved (allocated plus cached). FSDP_CUDA_POISON=1 fills
// every block handed out with 0xFF bytes (NaN in every float type), so a
// kernel that leaves an output element unwritten is caught by the tests.
#include "fsdp/core/allocator.h"

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "fsdp/core/env.h"
#include "fsdp/core/error.h"
#include "src/core/gpu.h"

namespace fsdp {

namespace {

size_t round_size(size_t n) {
  if (n < (1u << 20)) return (n + 511) / 512 * 512;
  return (n + (2u << 20) - 1) / (2u << 20) * (2u << 20);
}

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {
    poison_ = env_str("FSDP_CUDA_POISON") == "1";
  }
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t size = round_size(nbytes);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.lower_bound(size);
      // Best fit, but never hand a block more than twice the request.
      if (it != free_.end() && it->first <= 2 * size) {
        p = it->second;
        sizes_[p] = it->first;
        free_.erase(it);
      }
    }
    if (!p) {
      cudaSetDevice(device_);
      cudaError_t e = cudaMalloc(&p, size);
      if (e != cudaSuccess) {  // give the cache back and try once more
        (void)cudaGetLastError();
        empty_cache();
        e = cudaMalloc(&p, size);
      }
      FSDP_CHECK(e == cudaSuccess,
                 "[allocator] cuda:{}: out of memory allocating {} bytes ({} allocated): {}",
                 device_, nbytes, allocated_.load(), cudaGetErrorString(e));
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[p] = size;
      reserved_ += int64_t(size);
    }
    if (poison_) cudaMemset(p, 0xFF, nbytes);
    int64_t now = allocated_.fetch_add(int64_t(nbytes)) + int64_t(nbytes);
    int64_t prev = peak_.load();
    while (now > prev && !peak_.compare_exchange_weak(prev, now)) {
    }
    allocations_.fetch_add(1);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    allocated_.fetch_sub(int64_t(nbytes));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(ptr);
    const size_t size = it != sizes_.end() ? it->second : round_size(nbytes);
    if (it != sizes_.end()) sizes_.erase(it);
    free_.emplace(size, ptr);
  }
  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return {allocated_.load(), peak_.load(), allocations_.load(), reserved_};
  }
  void reset_peak() override { peak_.store(allocated_.load()); }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    for (auto& [size, p] : free_) {
      cudaFree(p);
      reserved_ -= int64_t(size);
    }
    free_.clear();
  }

 private:
  int device_;
  bool poison_ = false;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;
  std::map<void*, size_t> sizes_;  // blocks handed out -> their rounded size
  int64_t reserved_ = 0;
  std::atomic<int64_t> allocated_{0}, peak_{0}, allocations_{0};
};

}  // namespace

Allocator& gpu::allocator(int device) {
  static std::array<CudaAllocator*, 64> allocators{};
  static std::mutex mu;
  FSDP_CHECK(device >= 0 && device < 64, "[allocator] bad CUDA device index {}", device);
  std::lock_guard<std::mutex> lock(mu);
  if (!allocators[device]) allocators[device] = new CudaAllocator(device);  // lives for the process
  return *allocators[device];
}

}  // namespace fsdp
