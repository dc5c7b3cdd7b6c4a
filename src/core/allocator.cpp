// The CPU allocator: aligned malloc with exact byte counters. The CUDA
// allocator lives in cuda_allocator.cpp and is compiled only with CUDA.
#include "fsdp/core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "fsdp/core/error.h"

namespace fsdp {

namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    FSDP_CHECK(p || rounded == 0, "[allocator] cpu: out of memory allocating {} bytes", nbytes);
    int64_t now = current_.fetch_add(int64_t(nbytes)) + int64_t(nbytes);
    int64_t prev = peak_.load();
    while (now > prev && !peak_.compare_exchange_weak(prev, now)) {
    }
    allocations_.fetch_add(1);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    std::free(ptr);
    current_.fetch_sub(int64_t(nbytes));
  }
  MemoryStats stats() const override { return {current_.load(), peak_.load(), allocations_.load()}; }
  void reset_peak() override { peak_.store(current_.load()); }

 private:
  std::atomic<int64_t> current_{0}, peak_{0}, allocations_{0};
};

}  // namespace

#ifdef FSDP_WITH_CUDA
Allocator& cuda_allocator(int device);  // cuda_allocator.cpp
#endif

Allocator& allocator_for(Device d) {
  static CpuAllocator cpu;
  if (d.is_cpu()) return cpu;
#ifdef FSDP_WITH_CUDA
  return cuda_allocator(d.index);
#else
  FSDP_FAIL("[allocator] {} requested but fsdp.cpp was built without CUDA", d.str());
#endif
}

}  // namespace fsdp
