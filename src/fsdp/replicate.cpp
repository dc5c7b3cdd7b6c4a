// replicate and the ReplicateModule methods: whole parameters on every rank in flat buffers,
// and one AVG all-reduce of the flat gradients at the end of the module's backward. The
// all-reduce averages each element over the ranks on its own, so where the ranks' gradients
// are the same the result is too: the one-rank run gives back its own gradients untouched (no
// collective runs at all).
#include "fsdp/fsdp/replicate.h"

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

#include "fsdp/core/error.h"
#include "fsdp/fsdp/fully_shard.h"

namespace fsdp {

ReplicateModule::ReplicateModule(nn::Module& module, std::shared_ptr<dist::DeviceMesh> mesh,
                                 const ReplicateOptions& options)
    : DataParallelModule(module), mesh_(std::move(mesh)) {
  auto named = module.named_parameters();
  std::vector<Tensor> given;  // values a parameter already holds, kept
  for (auto& [name, p] : named) given.push_back(p->data);
  flat_ = nn::materialize(module, options.init_dtype, options.seed, mesh_->device(),
                          nn::kFlatAlignElems);
  for (size_t i = 0; i < named.size(); ++i) {
    nn::Parameter& p = *named[i].second;
    if (given[i].defined()) p.data.copy_(given[i]);
    if (p.shape.size() == 1)
      one_d_.emplace_back(p.data.offset() - flat_.params.offset(), p.data.numel());
  }
}

std::shared_ptr<UnshardHandle> ReplicateModule::unshard(bool) {
  return std::make_shared<UnshardHandle>();
}

std::vector<nn::ParamGroup> ReplicateModule::param_groups(double weight_decay, bool decay_1d) {
  nn::ParamGroup g{flat_.params, flat_.grads, weight_decay};
  if (!decay_1d) g.no_decay = one_d_;
  return {g};
}

void ReplicateModule::zero_grad() { flat_.grads.zero_(); }

DataParallelModule::CommStats ReplicateModule::comm_stats() const {
  return {.comm_seconds = replicate_group()->comm_seconds(), .exposed_seconds = exposed_seconds_};
}

Tensor ReplicateModule::post_backward(nn::Module&, const Tensor& dx) {
  const std::shared_ptr<dist::ProcessGroup> group = replicate_group();
  if (!requires_sync_ || group->size() == 1) return dx;
  const auto t0 = std::chrono::steady_clock::now();
  group->all_reduce(flat_.grads, dist::ReduceOp::AVG)->wait();
  exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return dx;
}

ReplicateModule& replicate(nn::Module& module, std::shared_ptr<dist::DeviceMesh> mesh,
                           ReplicateOptions options) {
  FSDP_CHECK(mesh, "[replicate] no device mesh");
  const std::string where = module.describe();
  FSDP_CHECK(mesh->ndim() == 1, "[replicate] the mesh must be 1-D (replicate), got {}",
             mesh->str());
  // Other hooks (a user's) may sit in the module's chain; another data-parallel wrapper may not.
  FSDP_CHECK(!module.find_hooks<ReplicateModule>(),
             "[replicate] {} is already replicated; apply replicate once per module", where);
  FSDP_CHECK(!fsdp_state(module),
             "[replicate] {} is sharded by fully_shard: a module is either replicated or sharded",
             where);
  for (const nn::Module* a = module.parent(); a; a = a->parent())
    FSDP_CHECK(!a->find_hooks<DataParallelModule>(),
               "[replicate] {} is inside {}, which {}: a module is replicated or sharded once",
               where, a->describe(),
               fsdp_state(*a) ? "fully_shard shards" : "replicate() replicates");
  module.for_each_module([&](nn::Module& m) {
    FSDP_CHECK(!fsdp_state(m),
               "[replicate] {} holds '{}', which fully_shard shards: a module is either "
               "replicated or sharded",
               where, m.path());
  });
  for (auto& [name, p] : module.named_parameters()) {
    FSDP_CHECK(p->requires_grad,
               "[replicate] {}: parameter '{}' is frozen (requires_grad false, a LoRA base); "
               "replicate steps every parameter of one flat buffer: shard the model with "
               "fully_shard, which keeps frozen parameters apart",
               where, name);
    // Its whole-model flat buffers and world-wide all-reduce know no placement.
    FSDP_CHECK(!p->placement,
               "[replicate] {}: parameter '{}' is placed {}; replicate composes with no "
               "placement: shard the model with fully_shard over the data-parallel dim",
               where, name, p->placement->str());
  }
  auto state = std::make_shared<ReplicateModule>(module, std::move(mesh), options);
  module.add_hooks(state);  // never removed: the state lives as long as the module
  return *state;
}

}  // namespace fsdp
