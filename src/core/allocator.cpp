// The CPU allocator: aligned malloc behind a cache of large blocks, with exact
// byte counters. The CUDA
// allocator lives in src/core/cuda/allocator.cpp (src/core/gpu.h).
#include "fsdp/core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "fsdp/core/env.h"
#include "fsdp/core/error.h"
#include "fsdp/core/trace.h"
#include "src/core/gpu.h"
#include "src/core/meta_allocator.h"

namespace fsdp {

namespace {

// Large blocks are cached by exact (page-rounded) size and handed out again:
// a training step frees and re-allocates the same sizes every step, and
// without the cache each large block is a fresh mmap whose pages fault in
// (and are zeroed by the kernel) on first touch. Small blocks go straight to
// malloc. `current`/`peak` count the bytes asked for, like PyTorch's
// memory_allocated; `reserved` adds what the cache holds.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kCacheMin = 64 << 10;

  void* allocate(size_t nbytes) override {
    void* p = nullptr;
    if (nbytes >= kCacheMin) {
      // Read here, where an error may be thrown (a bad FSDP_CPU_CACHE_MB is named), so that
      // deallocate (from destructors) finds it read and never throws.
      (void)cache_limit();
      const size_t rounded = round_up(nbytes);
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(rounded);
      if (it != free_.end()) {
        p = it->second;
        free_.erase(it);
        cached_ -= int64_t(rounded);
      }
    }
    if (!p) {
      const size_t rounded = nbytes >= kCacheMin ? round_up(nbytes) : (nbytes + 63) / 64 * 64;
      p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
      if (!p && rounded) {  // give the cache back and try once more
        release_cache();
        p = std::aligned_alloc(64, rounded);
      }
      FSDP_CHECK(p || rounded == 0, "[allocator] cpu: out of memory allocating {} bytes", nbytes);
    }
    int64_t now = current_.fetch_add(int64_t(nbytes)) + int64_t(nbytes);
    int64_t prev = peak_.load();
    while (now > prev && !peak_.compare_exchange_weak(prev, now)) {
    }
    allocations_.fetch_add(1);
    if (trace::recording_memory()) count(now);
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    const int64_t now = current_.fetch_sub(int64_t(nbytes)) - int64_t(nbytes);
    if (trace::recording_memory()) count(now);
    if (nbytes >= kCacheMin && ptr) {
      const size_t rounded = round_up(nbytes);
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + int64_t(rounded) <= cache_limit()) {
        free_.emplace(rounded, ptr);
        cached_ += int64_t(rounded);
        return;
      }
    }
    std::free(ptr);
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return {current_.load(), peak_.load(), allocations_.load(), current_.load() + cached_};
  }
  void reset_peak() override { peak_.store(current_.load()); }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_cache();
  }

 private:
  static void count(int64_t bytes) {
    trace::Record r;
    r.kind = trace::Kind::counter;
    r.name = "memory";
    r.device = "cpu";
    r.tid = trace::thread_id();
    r.begin_ns = r.end_ns = trace::now_ns();
    r.value = bytes;
    trace::add(std::move(r));
  }
  static size_t round_up(size_t n) { return (n + 4095) / 4096 * 4096; }
  static int64_t cache_limit() {
    static const int64_t limit = int64_t(env_double("FSDP_CPU_CACHE_MB") * 1048576.0);
    return limit;
  }
  void release_cache() {  // mu_ held
    for (auto& [size, p] : free_) std::free(p);
    free_.clear();
    cached_ = 0;
  }

  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;
  int64_t cached_ = 0;
  std::atomic<int64_t> current_{0}, peak_{0}, allocations_{0};
};

}  // namespace

Allocator& allocator_for(Device d) {
  static CpuAllocator cpu;
  if (d.is_cpu()) return cpu;
  if (d.is_meta()) return meta_allocator();
  return gpu::allocator(d.index);
}

}  // namespace fsdp
