// The meta device's allocator (fsdp/core/meta.h): a model of the planned device's allocator,
// block by block, with the peak and what held its bytes.
#include "fsdp/core/meta.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fsdp/core/allocator.h"
#include "fsdp/core/error.h"
#include "src/core/meta_allocator.h"

namespace fsdp {

namespace meta {

namespace {

thread_local Term t_term = Term::activations;
thread_local std::string t_where = "setup";

constexpr int64_t kCacheMin = 64 << 10;  // core/allocator.cpp's smallest cached block
int64_t page(int64_t n) { return (n + 4095) / 4096 * 4096; }
int64_t granule(int64_t n) { return (n + 63) / 64 * 64; }

class MetaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t n = int64_t(nbytes);
    // An address in the reserved range (no access), unique among the live blocks.
    int64_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      FSDP_CHECK(next_ < kSlots, "[meta] more than {} meta tensors' storage alive at once", kSlots);
      slot = next_++;
    }
    void* p = reserved() + (slot << 6);
    int64_t held = page(n);  // the bytes of the block behind it (a cached one may be larger)
    if (cpu_ && n >= kCacheMin) {
      auto it = cached_.lower_bound(page(n));
      if (it != cached_.end() && it->first <= page(page(n) + page(n) / 4)) {
        held = it->first;
        cached_.erase(it);
        cached_bytes_ -= held;
      } else {
        resident_ += held;
      }
    } else if (cpu_) {
      resident_ += granule(n);
    }
    FSDP_CHECK(blocks_.emplace(p, Block{n, held, t_term}).second,
               "[meta] internal: a slot given twice");
    live_ += n;
    term_[size_t(t_term)] += n;
    s_.term_peak[size_t(t_term)] = std::max(s_.term_peak[size_t(t_term)], term_[size_t(t_term)]);
    ++allocations_;
    note(0);
    return p;
  }

  void deallocate(void* ptr, size_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(ptr);
    FSDP_CHECK(it != blocks_.end(), "[meta] internal: a block freed that was not allocated");
    const auto [n, held, term] = it->second;
    blocks_.erase(it);
    free_.push_back((static_cast<char*>(ptr) - reserved()) >> 6);
    live_ -= n;
    term_[size_t(term)] -= n;
    if (!cpu_) return;
    if (n < kCacheMin) {
      resident_ -= granule(n);
    } else if (cached_bytes_ + held <= cache_limit_) {
      cached_.emplace(held, step_);
      cached_bytes_ += held;
    } else {
      resident_ -= held;
    }
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return {live_, peak_live_, allocations_, cpu_ ? resident_ : live_};
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    peak_live_ = live_;
  }
  // core/allocator.cpp's: the cached blocks no allocation took during the step now ending go.
  void end_step() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = cached_.begin(); it != cached_.end();) {
      if (cpu_ && it->second < step_) {
        cached_bytes_ -= it->first;
        resident_ -= it->first;
        it = cached_.erase(it);
      } else {
        ++it;
      }
    }
    ++step_;
  }

  void reset(const Target& t) {
    std::lock_guard<std::mutex> lock(mu_);
    FSDP_CHECK(blocks_.empty(), "[meta] reset with {} meta tensors' storage still alive",
               blocks_.size());
    FSDP_CHECK(t.device.is_cpu() || t.device.is_cuda(),
               "[meta] the planned device is cpu or cuda, got {}", t.device.str());
    FSDP_CHECK(t.cpu_cache_bytes >= 0, "[meta] a negative cache limit ({} bytes)",
               t.cpu_cache_bytes);
    cpu_ = t.device.is_cpu();
    cache_limit_ = t.cpu_cache_bytes;
    target_ = t;
    cached_.clear();
    live_ = resident_ = cached_bytes_ = peak_live_ = allocations_ = step_ = 0;
    term_ = {};
    s_ = Stats{};
  }

  void scratch(int64_t bytes) {
    if (bytes <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (cpu_) note(bytes);
  }

  Target target() const {
    std::lock_guard<std::mutex> lock(mu_);
    return target_;
  }

  Stats snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    Stats s = s_;
    s.live = live_;
    s.peak_live = peak_live_;
    s.allocations = allocations_;
    return s;
  }

 private:
  // 64 MiB of address space with no access, one 64-byte slot per live block (a freed slot is
  // handed out again), so that a kernel that touches a meta tensor faults at its first bytes.
  static constexpr int64_t kReserve = int64_t(64) << 20;
  static constexpr int64_t kSlots = kReserve >> 6;
  static char* reserved() {
    static char* base = [] {
      void* p = mmap(nullptr, size_t(kReserve), PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      FSDP_CHECK(p != MAP_FAILED, "[meta] could not reserve {} MiB of address space",
                 kReserve >> 20);
      return static_cast<char*>(p);
    }();
    return base;
  }

  void note(int64_t scratch) {  // mu_ held
    peak_live_ = std::max(peak_live_, live_);
    const int64_t now = (cpu_ ? resident_ : live_) + scratch;
    if (now <= s_.peak) return;
    s_.peak = now;
    for (int t = 0; t < kTerms; ++t) s_.at_peak[size_t(t)] = term_[size_t(t)];
    s_.at_peak[size_t(Term::work)] += scratch;
    s_.scratch_at_peak = scratch;
    int64_t terms = 0;
    for (int64_t v : s_.at_peak) terms += v;
    s_.cache_at_peak = now - terms;  // freed blocks kept, and rounding
    s_.where_at_peak = t_where;
  }

  struct Block {
    int64_t bytes, held;  // asked for; of the block behind it (CPU: page-rounded, or larger)
    Term term;
  };
  mutable std::mutex mu_;
  bool cpu_ = true;
  int64_t cache_limit_ = 0;
  Target target_;
  std::unordered_map<void*, Block> blocks_;
  // page-rounded size -> the end_step count when each free block of that size was cached, equal
  // sizes oldest first (taken first), as the CPU allocator's
  std::multimap<int64_t, int64_t> cached_;
  std::vector<int64_t> free_;          // slots of freed blocks
  int64_t next_ = 0, live_ = 0, resident_ = 0, cached_bytes_ = 0, peak_live_ = 0, step_ = 0;
  int64_t allocations_ = 0;
  std::array<int64_t, kTerms> term_{};
  Stats s_;
};

MetaAllocator& the_allocator() {
  static auto* a = new MetaAllocator;  // leaked: meta tensors may outlive static destructors
  return *a;
}

}  // namespace

void reset(const Target& target) { the_allocator().reset(target); }
Stats stats() { return the_allocator().snapshot(); }
Target target() { return the_allocator().target(); }
void scratch(int64_t bytes) { the_allocator().scratch(bytes); }

TermScope::TermScope(Term term) : saved_(t_term) { t_term = term; }
TermScope::~TermScope() { t_term = saved_; }

At::At(std::string where) : saved_(std::move(t_where)) { t_where = std::move(where); }
At::~At() { t_where = std::move(saved_); }

}  // namespace meta

Allocator& meta_allocator() { return meta::the_allocator(); }

}  // namespace fsdp
