// The memory plan's model of the allocator (fsdp/train/memory_plan.h): live bytes, as the
// allocator's `current` counts them, and what the process holds. On CPU a block of 64 KiB or more
// is page-rounded and, once freed, kept for the next request of that size while the cache holds
// less than its limit (core/allocator.cpp); smaller ones come from malloc. Kernel scratch
// (std::vector in kernels/cpu) is resident for one op but never counted as live. When
// core/allocator.cpp changes how it caches, this changes with it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::train::replay {

// What holds a block's bytes: the memory plan's terms.
enum Term : uint8_t { kPersistent, kParams, kGrads, kActivations, kLogits, kWork, kData, kTerms };

class AllocatorReplay {
 public:
  using H = int32_t;  // a block; -1 for none
  AllocatorReplay(bool cpu, int64_t cache_limit) : cpu_(cpu), cache_limit_(cache_limit) {}

  H alloc(int64_t bytes, Term term);
  void free(H h);
  // Memory an op holds outside the allocator while it runs (CPU kernels' scratch).
  void scratch(int64_t bytes);
  // Names where in the step the next allocations happen, for the peak's `at`.
  void at(std::string where) { where_ = std::move(where); }

  int64_t peak() const { return peak_; }
  int64_t peak_live() const { return peak_live_; }
  const std::array<int64_t, kTerms>& terms_at_peak() const { return at_peak_; }
  int64_t cache_at_peak() const { return cache_at_peak_; }
  const std::string& where_at_peak() const { return where_at_peak_; }

 private:
  static constexpr int64_t kCacheMin = 64 << 10;
  static int64_t page(int64_t n) { return (n + 4095) / 4096 * 4096; }
  void note(int64_t scratch);

  struct Block {
    int64_t bytes;
    Term term;
    bool live;
  };
  bool cpu_;
  int64_t cache_limit_;
  std::vector<Block> blocks_;
  std::map<int64_t, int64_t> cached_;  // page-rounded size -> free blocks of that size
  int64_t live_ = 0, resident_ = 0, cached_bytes_ = 0, peak_ = 0, peak_live_ = 0;
  int64_t cache_at_peak_ = 0;
  std::array<int64_t, kTerms> term_{}, at_peak_{};
  std::string where_, where_at_peak_;
};

}  // namespace fsdp::train::replay
