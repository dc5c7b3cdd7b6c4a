// DataParallelModule: what a training step asks of a data-parallel model, whether its
// parameters are sharded (fully_shard's FSDPModule) or whole on every rank (replicate's
// ReplicateModule). A trainer holds one and calls the same methods either way:
//
//   root.zero_grad();
//   for each microbatch: root.set_requires_gradient_sync(last); forward; backward;
//   clip_grad_norm_async(root.param_groups(wd), max_norm, root.shard_group());
//   opt.step();
//
// Both are ModuleHooks, one link of the chain of the module they wrap (a user's hooks may sit
// beside it; one module takes one of them, once): the gradient collective of a step
// (reduce-scatter or all-reduce) runs from the hooks, inside backward(), so the step itself
// names no collective.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "fsdp/distributed/process_group.h"
#include "fsdp/nn/module.h"
#include "fsdp/nn/param_group.h"

namespace fsdp {

// Waits for an asynchronous unshard() (nothing to wait for under replicate).
class UnshardHandle {
 public:
  explicit UnshardHandle(std::function<void()> wait = {}) : wait_(std::move(wait)) {}
  void wait() {
    if (wait_) wait_();
  }

 private:
  std::function<void()> wait_;
};

class DataParallelModule : public nn::ModuleHooks {
 public:
  nn::Module& module() const { return *module_; }

  // All-gathers the module's parameters now (a no-op when they are whole); async returns before
  // they arrive.
  virtual std::shared_ptr<UnshardHandle> unshard(bool async = false) = 0;
  virtual void reshard() = 0;
  // false: backward keeps the gradients local and accumulates; the next backward with true
  // reduces them over the ranks (gradient accumulation without a collective per microbatch).
  virtual void set_requires_gradient_sync(bool sync) = 0;
  // This rank's parameters and gradients as flat buffer pairs, for the optimizer.
  // decay_1d = false: 1-D parameters (norms, biases) get no weight decay.
  virtual std::vector<nn::ParamGroup> param_groups(double weight_decay, bool decay_1d = true) = 0;
  // Clears this rank's gradients (module().zero_grad() does the same).
  virtual void zero_grad() = 0;
  // The group over which a parameter's pieces lie, for norms over all of them; nullptr when
  // every rank holds every parameter whole.
  virtual std::shared_ptr<dist::ProcessGroup> shard_group() const = 0;

  // Cumulative seconds: spent in the gradient (and parameter) collectives on their threads,
  // and spent by the compute thread waiting for them (the communication compute did not hide).
  struct CommStats {
    double comm_seconds = 0, exposed_seconds = 0;
    int64_t all_gather_bytes = 0;  // what this rank's all-gathers wrote (every rank's shards)
  };
  virtual CommStats comm_stats() const = 0;

  bool owns_gradients() const override { return true; }
  void zero_grad_hook() override { zero_grad(); }

 protected:
  explicit DataParallelModule(nn::Module& module) : module_(&module) {}

 private:
  nn::Module* module_;
};

}  // namespace fsdp
