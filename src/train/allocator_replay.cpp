// The allocator, replayed (src/train/allocator_replay.h): what core/allocator.cpp would hold,
// block by block, with the peak and what held its bytes.
#include "src/train/allocator_replay.h"

#include <algorithm>
#include <cstddef>

#include "fsdp/core/error.h"

namespace fsdp::train::replay {

AllocatorReplay::H AllocatorReplay::alloc(int64_t bytes, Term term) {
  if (bytes <= 0) return -1;
  blocks_.push_back({bytes, term, true});
  live_ += bytes;
  term_[term] += bytes;
  if (cpu_) {
    if (bytes >= kCacheMin) {
      int64_t& cached = cached_[page(bytes)];
      if (cached > 0) {
        --cached;
        cached_bytes_ -= page(bytes);
      } else {
        resident_ += page(bytes);
      }
    } else {
      resident_ += (bytes + 63) / 64 * 64;
    }
  }
  note(0);
  return H(blocks_.size() - 1);
}

void AllocatorReplay::free(H h) {
  if (h < 0) return;
  Block& b = blocks_[size_t(h)];
  FSDP_CHECK(b.live, "[memory plan] internal: a block is freed twice");
  b.live = false;
  live_ -= b.bytes;
  term_[b.term] -= b.bytes;
  if (!cpu_) return;
  if (b.bytes < kCacheMin) {
    resident_ -= (b.bytes + 63) / 64 * 64;
  } else if (cached_bytes_ + page(b.bytes) <= cache_limit_) {
    ++cached_[page(b.bytes)];
    cached_bytes_ += page(b.bytes);
  } else {
    resident_ -= page(b.bytes);
  }
}

void AllocatorReplay::scratch(int64_t bytes) {
  if (!cpu_ || bytes <= 0) return;
  note(bytes);
}

void AllocatorReplay::note(int64_t scratch) {
  peak_live_ = std::max(peak_live_, live_);
  const int64_t now = (cpu_ ? resident_ : live_) + scratch;
  if (now <= peak_) return;
  peak_ = now;
  at_peak_ = term_;
  at_peak_[kWork] += scratch;
  int64_t terms = 0;
  for (int64_t t : at_peak_) terms += t;
  cache_at_peak_ = now - terms;  // freed blocks held, and rounding
  where_at_peak_ = where_;
}

}  // namespace fsdp::train::replay
