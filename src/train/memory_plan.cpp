// The memory plan (fsdp/train/memory_plan.h): the options checked, one training step's
// allocations replayed through a model of the allocator (src/train/step_replay.h, over
// allocator_replay.h), and the bytes held at the replay's peak, named by what holds them.
#include "fsdp/train/memory_plan.h"

#include <array>
#include <initializer_list>

#include "fsdp/core/error.h"
#include "src/train/step_replay.h"

namespace fsdp::train {

namespace replay {

MemoryPlan StepReplay::run() {
  // Persistent: each group's sharded parameters and gradients (fully_shard), or the flat
  // buffers (--shard none), and AdamW's two moments of the same shape.
  r_.at("setup");
  // A frozen group (LoRA's base) has its parameters only: no gradients, no AdamW state.
  for (int k = 0; k < 4; ++k)
    if (o_.fully_shard) {
      for (const Group& g : groups_) r_.alloc(g.G * master_, kPersistent);
      if (k == 0)
        for (const auto* fs : {&frozen_, &packed_})
          for (const Group& f : *fs) r_.alloc(f.G * f.master, kPersistent);
    } else {
      r_.alloc(flat_ * master_, kPersistent);
    }
  persistent_ = (o_.fully_shard ? 0 : 4 * flat_) * master_;
  if (o_.fully_shard) {
    for (const Group& g : groups_) persistent_ += 4 * g.G * g.master;
    for (const auto* fs : {&frozen_, &packed_})
      for (const Group& f : *fs) persistent_ += f.G * f.master;
  }
  // Two steps: the second starts with the first's staged batch and its blocks cached.
  H staged = -1;
  for (int step = 0; step < 2; ++step)
    for (int64_t micro = 0; micro < o_.grad_accum; ++micro) {
      sync_ = micro == o_.grad_accum - 1;
      const H batch = staged >= 0 ? staged : alloc_batch();
      microbatch();
      staged = alloc_batch();  // DataLoader::prefetch, after the backward
      free_batch(batch);
    }
  MemoryPlan p;
  p.peak_allocated = r_.peak_live();
  p.persistent = persistent_;
  p.at = r_.where_at_peak();
  const auto& t = r_.terms_at_peak();
  auto add = [&](const char* name, const char* what, int64_t bytes) {
    p.terms.push_back({name, what, bytes});
    p.peak += bytes;
  };
  add("persistent", "sharded params, grads, AdamW m and v", t[kPersistent]);
  add("params in flight", "all-gathered and unsharded params", t[kParams]);
  add("grads in flight", "unsharded grads, reduce-scatter buffers", t[kGrads]);
  add("activations", "saved for the backward", t[kActivations]);
  add("logits", "logits (dlogits in place), loss", t[kLogits]);
  add("op working set", "activation grads, op temporaries", t[kWork]);
  add("data", "token batches", t[kData]);
  if (cpu_) {
    add("allocator cache", "freed blocks kept for reuse", r_.cache_at_peak());
    add("process baseline", "runtime, libraries, threads, data", o_.baseline_bytes);
  }
  return p;
}

}  // namespace replay

MemoryPlan plan_memory(const MemoryPlanOptions& o) {
  o.model.validate();
  FSDP_CHECK(o.shards >= 1 && o.replicas >= 1 && o.grad_accum >= 1 && o.checkpoint_every >= 0 &&
                 o.threads >= 0 && o.cpu_cache_bytes >= 0 && o.baseline_bytes >= 0,
             "[memory plan] shards {}, replicas {}, grad_accum {}, checkpoint_every {}, threads {}, "
             "cache {} and baseline {} bytes: expected >= 1, >= 1, >= 1 and >= 0 for the rest",
             o.shards, o.replicas, o.grad_accum, o.checkpoint_every, o.threads, o.cpu_cache_bytes,
             o.baseline_bytes);
  FSDP_CHECK(o.fully_shard || (o.shards == 1 && o.replicas == 1 && !o.param_dtype &&
                               !o.reduce_dtype),
             "[memory plan] shards, replicas and dtype policies are fully_shard's");
  return replay::StepReplay(o).run();
}

}  // namespace fsdp::train
