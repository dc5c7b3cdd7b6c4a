// One allocator per device. Every tensor byte goes through it, so its
// counters are the truth about memory: `current` bytes live now and `peak`
// bytes since the last reset_peak(). The per-step "peak mem" figure of
// fsdp-train is read from here. CPU blocks are 64-byte aligned for SIMD.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fsdp/core/device.h"

namespace fsdp {

struct MemoryStats {
  int64_t current = 0;  // bytes allocated and not yet freed
  int64_t peak = 0;     // high-water mark of `current` since reset_peak()
  int64_t allocations = 0;
  int64_t reserved = 0;  // current plus what the allocator keeps cached for reuse (CPU: and the
                         // bytes of a cached block handed out beyond its request)
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  // nbytes is allocate's for that pointer (the CPU allocator maps a block of 64 KiB or more and
  // mallocs a smaller one, and tells them apart by it).
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached, unused blocks to the system.
  virtual void empty_cache() {}
  // Marks the end of a training step (train::train_step calls it): cached blocks that no
  // allocation took during the whole step now ending go back to the system. A step asks for the
  // same sizes every step, so its blocks stay cached; a size that changes from step to step (the
  // rows expert parallel receives follow the routing) would otherwise stay cached unused, one
  // block per size ever seen, up to the cache's limit.
  virtual void end_step() {}
};

Allocator& allocator_for(Device d);
inline MemoryStats memory_stats(Device d = Device::cpu()) { return allocator_for(d).stats(); }

}  // namespace fsdp
