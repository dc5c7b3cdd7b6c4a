// The meta device (Device::meta()): tensors with a shape and a dtype and no storage, as PyTorch's.
// Ops on meta tensors make their outputs and launch nothing (fsdp/ops: the meta backend), copies
// and fills do nothing, and a meta tensor read on the host reads zeros. Running the real code on
// them says what it allocates, block by block, in the order it does: the memory plan
// (fsdp/train/memory_plan.h) runs the training step on the meta device.
//
// Its allocator is a model of the device planned for (Target). On CPU that is core/allocator.cpp's
// caching allocator: a freed block of 64 KiB or more is kept, page-rounded, for a later request of
// that size while the cache holds less than its limit; smaller ones come from malloc (64-byte
// granules). The model counts live bytes (the allocator's `current`), what the process holds
// (CPU: the resident bytes) and their peaks, and at the peak what each term held: every
// allocation is made under the innermost TermScope of its thread. The addresses it gives out lie
// in a small reserved range with no access, so a kernel that touches a meta tensor faults at its
// first bytes.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "fsdp/core/device.h"

namespace fsdp::meta {

// What holds a block's bytes: the memory plan's terms. loss: what a step's loss part
// (train::Loss) allocates itself, from its forward to its backward.
enum class Term : uint8_t { persistent, params, grads, activations, logits, work, data, loss };
inline constexpr int kTerms = 8;

struct Target {
  Device device = Device::cpu();  // the device whose allocator is modelled: cpu or cuda
  int64_t cpu_cache_bytes = 0;    // the CPU allocator's cache limit (FSDP_CPU_CACHE_MB)
};

struct Stats {
  int64_t live = 0, peak_live = 0;  // bytes allocated and not freed; their high-water mark
  int64_t peak = 0;                 // what the process held at most (CPU: resident; CUDA: live)
  std::array<int64_t, kTerms> at_peak{};  // the live bytes of each term at `peak`
  std::array<int64_t, kTerms> term_peak{};  // each term's own most live bytes, at any moment
  int64_t cache_at_peak = 0;    // CPU: freed blocks the cache held at `peak`, and rounding
  int64_t scratch_at_peak = 0;  // CPU: the kernel scratch at `peak` (counted in work)
  std::string where_at_peak;    // the innermost At at `peak`
  int64_t allocations = 0;
};

// Starts a model from nothing for `target`. Throws while meta tensors are alive.
void reset(const Target& target);
Target target();  // the last reset's
Stats stats();

// Names what this thread's allocations hold while it is alive (nested: the innermost).
class TermScope {
 public:
  explicit TermScope(Term term);
  ~TermScope();
  TermScope(const TermScope&) = delete;
  TermScope& operator=(const TermScope&) = delete;

 private:
  Term saved_;
};

// Names where in the step the allocations of this thread happen, for the peak's `where`.
class At {
 public:
  explicit At(std::string where);
  ~At();
  At(const At&) = delete;
  At& operator=(const At&) = delete;

 private:
  std::string saved_;
};

// Memory an op holds outside the allocator while it runs (the CPU kernels' std::vector scratch):
// counted at this moment, then gone.
void scratch(int64_t bytes);

}  // namespace fsdp::meta
