// The CPU allocator: large blocks mapped from the system behind a cache of them, small ones from
// aligned malloc, with exact byte counters. The CUDA allocator lives in
// src/core/cuda/allocator.cpp (src/core/gpu.h).
#include "fsdp/core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>

#include <sys/mman.h>

#include "fsdp/core/env.h"
#include "fsdp/core/error.h"
#include "fsdp/core/trace.h"
#include "src/core/gpu.h"
#include "src/core/meta_allocator.h"

namespace fsdp {

namespace {

// Large blocks are cached by (page-rounded) size and handed out again: a
// training step frees and re-allocates the same sizes every step, and without
// the cache each large block is a fresh mmap whose pages fault in (and are
// zeroed by the kernel) on first touch. A request takes a cached block up to a
// quarter larger than it when none fits exactly, and a cached block that a
// whole step did not take is unmapped at the step's end (end_step): sizes that
// change every step (expert parallel's rows follow the routing) neither pile up
// in the cache nor miss it every time. Large blocks are mapped here rather than
// malloc'd: glibc raises its mmap threshold to the size of each mapped block
// freed (up to 32 MiB), after which blocks of changing sizes come from its heap
// and stay resident there, fragmented, after they are freed. Small blocks go
// straight to malloc. `current`/`peak` count the bytes asked for, like
// PyTorch's memory_allocated; `reserved` adds what the cache holds and what a
// block taken larger than its request holds beyond it.
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
      auto it = free_.lower_bound(rounded);
      if (it != free_.end() && it->first <= fit_limit(rounded)) {
        p = it->second.ptr;
        if (it->first != rounded) {
          larger_.emplace(p, it->first);
          larger_bytes_ += int64_t(it->first - rounded);
        }
        cached_ -= int64_t(it->first);
        free_.erase(it);
      }
    }
    if (!p) {
      const bool large = nbytes >= kCacheMin;
      const size_t rounded = large ? round_up(nbytes) : (nbytes + 63) / 64 * 64;
      p = rounded ? fresh(rounded, large) : nullptr;
      if (!p && rounded) {  // give the cache back and try once more
        empty_cache();
        p = fresh(rounded, large);
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
      size_t rounded = round_up(nbytes);
      std::lock_guard<std::mutex> lock(mu_);
      if (auto l = larger_.find(ptr); l != larger_.end()) {  // a cached block larger than asked
        larger_bytes_ -= int64_t(l->second - rounded);
        rounded = l->second;
        larger_.erase(l);
      }
      if (cached_ + int64_t(rounded) <= cache_limit()) {
        free_.emplace(rounded, Cached{ptr, step_});
        cached_ += int64_t(rounded);
        return;
      }
      ::munmap(ptr, rounded);
      return;
    }
    std::free(ptr);
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return {current_.load(), peak_.load(), allocations_.load(),
            current_.load() + cached_ + larger_bytes_};
  }
  void reset_peak() override { peak_.store(current_.load()); }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_cache();
  }
  void end_step() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end();) {
      if (it->second.step < step_) {  // cached before this step began, and not taken since
        ::munmap(it->second.ptr, it->first);
        cached_ -= int64_t(it->first);
        it = free_.erase(it);
      } else {
        ++it;
      }
    }
    ++step_;
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
  // The largest cached block a request of `rounded` bytes takes: up to a quarter more (whole
  // pages), so that sizes that change a little from step to step (expert parallel's rows) reuse
  // each other's blocks. meta.cpp's plan takes the same.
  static size_t fit_limit(size_t rounded) { return round_up(rounded + rounded / 4); }
  static int64_t cache_limit() {
    static const int64_t limit = int64_t(env_double("FSDP_CPU_CACHE_MB") * 1048576.0);
    return limit;
  }
  // A large block is mapped (page-aligned, so 64-byte aligned); a small one is malloc'd.
  static void* fresh(size_t rounded, bool large) {
    if (!large) return std::aligned_alloc(64, rounded);
    void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void release_cache() {  // mu_ held
    for (auto& [size, c] : free_) ::munmap(c.ptr, size);
    free_.clear();
    cached_ = 0;
  }

  struct Cached {
    void* ptr;
    int64_t step;  // end_step's count when it was cached
  };
  mutable std::mutex mu_;
  std::multimap<size_t, Cached> free_;  // page-rounded size -> blocks; equal sizes oldest first
  std::unordered_map<void*, size_t> larger_;  // blocks handed out larger than asked: their size
  int64_t cached_ = 0, step_ = 0;
  int64_t larger_bytes_ = 0;  // what the blocks in larger_ hold beyond their requests' pages
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
