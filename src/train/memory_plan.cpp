// The memory plan (fsdp/train/memory_plan.h), from the real code: the run's model built by its
// family's spec on the meta device (fsdp/core/meta.h), sharded by fully_shard over a meta group
// of the real world size (this process stands for its rank 0), the trainer's optimizer (AdamW by
// default) over the shards, and two training steps with the trainer's loss (train_step, as
// fsdp-train runs them) whose every allocation goes through the meta allocator's model of the
// planned device's allocator. Nothing is computed and nothing is communicated: the plan is the
// allocations the code makes, in the order it makes them.
#include "fsdp/train/memory_plan.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/error.h"
#include "fsdp/core/meta.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/models/spec.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/optimizer.h"
#include "fsdp/train/loss.h"
#include "fsdp/train/step.h"
#include "src/distributed/meta_group.h"

namespace fsdp::train {

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
  meta::reset({.device = o.device, .cpu_cache_bytes = o.cpu_cache_bytes});
  const int world = int(o.shards * o.replicas);
  std::vector<int64_t> shape =
      o.replicas > 1 ? std::vector<int64_t>{o.replicas, o.shards} : std::vector<int64_t>{o.shards};
  auto group = std::make_shared<dist::MetaGroup>(world, 0, shape);
  MemoryPlan p;
  {
    auto mesh = o.replicas > 1 ? std::make_shared<dist::DeviceMesh>(
                                     group, shape, std::vector<std::string>{"replicate", "shard"})
                               : std::make_shared<dist::DeviceMesh>(group, shape);
    const FullyShardOptions fsdp{
        .reshard_after_forward = o.reshard_after_forward,
        .mp_policy = {.param_dtype = o.param_dtype, .reduce_dtype = o.reduce_dtype},
        .init_dtype = o.dtype,
        .frozen_dtype = o.frozen_dtype,
        .frozen_packed = o.frozen_packed};
    std::unique_ptr<nn::Module> model;
    DataParallelModule* parallel = nullptr;
    std::optional<meta::TermScope> setup;
    if (o.build) {  // the caller's model, made and sharded as its trainer does
      setup.emplace(meta::Term::persistent);
      PlannedModel built = o.build(mesh, fsdp);
      FSDP_CHECK(built.model && built.parallel,
                 "[memory plan] MemoryPlanOptions::build made no model or no parallel module");
      model = std::move(built.model);
      parallel = built.parallel;
    } else {
      const models::ModelSpec& spec = models::spec_to_train(o.model);
      model = spec.build(o.model);
      setup.emplace(meta::Term::persistent);
      FSDP_CHECK(o.expert_parallel == 1 || (o.fully_shard && o.replicas == 1),
                 "[memory plan] expert parallel {} plans fully_shard without replicas",
                 o.expert_parallel);
      parallel = spec.parallelize(
                         *dynamic_cast<nn::Transformer*>(model.get()),
                         {.mesh = mesh,
                          .replicate = !o.fully_shard,
                          .fsdp = fsdp,
                          .checkpoint_every = o.checkpoint_every,
                          .expert_mesh = o.expert_parallel > 1
                                             ? dist::make_expert_mesh(group, o.expert_parallel)
                                             : nullptr})
                     .parallel;
    }
    std::unique_ptr<optim::Optimizer> opt =
        o.optimizer ? o.optimizer(parallel->param_groups(0.0))
                    : std::make_unique<optim::AdamW>(parallel->param_groups(0.0),
                                                     ops::AdamWHyper{});
    FSDP_CHECK(opt != nullptr, "[memory plan] the optimizer factory made no optimizer");
    const std::unique_ptr<nn::Module> reference = o.reference ? o.reference(mesh, fsdp) : nullptr;
    setup.reset();
    p.persistent = meta::stats().live;
    data::DataLoader loader(std::make_shared<data::RandomTokenSource>(o.model.vocab, 0),
                            o.model.batch * world, 0, world, o.model.seq, Device::meta());
    CrossEntropy cross_entropy(o.fused_loss);
    Loss& loss = o.loss ? *o.loss : cross_entropy;
    const StepParts parts{.model = *model,
                          .parallel = *parallel,
                          .optimizer = *opt,
                          .loader = loader,
                          .group = *group,
                          .loss = &loss};
    for (int64_t step = 0; step < 2; ++step)  // the second starts with the first's staged batch
      train_step(parts, step, {.grad_accum = o.grad_accum, .fused_loss = o.fused_loss});
    const meta::Stats s = meta::stats();
    p.peak_allocated = s.peak_live;
    p.at = s.where_at_peak;
    p.loss = loss.describe();
    p.loss_bytes = s.term_peak[size_t(meta::Term::loss)];
    auto add = [&](const char* name, const char* what, int64_t bytes) {
      p.terms.push_back({name, what, bytes});
      p.peak += bytes;
    };
    const auto t = [&](meta::Term term) { return s.at_peak[size_t(term)]; };
    add("persistent",
        o.reference ? "sharded params, grads, AdamW m and v; the reference's shards"
                    : "sharded params, grads, AdamW m and v",
        t(meta::Term::persistent));
    add("params in flight", "all-gathered and unsharded params", t(meta::Term::params));
    add("grads in flight", "unsharded grads, reduce-scatter buffers", t(meta::Term::grads));
    add("activations", "saved for the backward", t(meta::Term::activations));
    add("logits", "the head's output and the loss", t(meta::Term::logits));
    add("op working set", "activation grads, op temporaries", t(meta::Term::work));
    add("data", "token batches", t(meta::Term::data));
    add("loss", "the loss's own buffers", t(meta::Term::loss));
    if (o.device.is_cpu()) {
      add("allocator cache", "freed blocks kept for reuse", s.cache_at_peak);
      add("process baseline", "runtime, libraries, threads, data", o.baseline_bytes);
    }
  }
  return p;
}

}  // namespace fsdp::train
