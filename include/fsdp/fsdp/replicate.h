// replicate: the DDP baseline beside fully_shard (FSDP2's composable replicate()).
//
//   fsdp::ReplicateModule& root = fsdp::replicate(model, mesh, {.seed = seed});
//   optim::AdamW opt(root.param_groups(0.01), {.lr = 3e-4});
//   root.zero_grad(); loss = model.forward(...); model.backward(...); opt.step();
//
// Every rank holds every parameter whole: replicate materialises the module's parameters into
// one flat buffer and its gradients into another (each parameter starting at a multiple of
// nn::kFlatAlignElems elements, so every tensor is 16-byte aligned for cuBLASLt), initialised
// from (seed, dotted name, element index) as fully_shard's shards are, so a replicated model
// equals a sharded one of the same seed. A module whose parameters already hold values keeps
// them (copied into the buffers).
//
// The gradients are averaged over the mesh in one bucket: one AVG all-reduce of the whole flat
// gradient buffer when the module's backward ends (its post-backward hook), waited for there.
// There is no overlap with the backward, which is what this baseline measures fully_shard
// against: the same bytes in one collective at the end. unshard() and reshard() do nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "fsdp/distributed/device_mesh.h"
#include "fsdp/fsdp/data_parallel.h"
#include "fsdp/nn/module.h"
#include "fsdp/nn/param_group.h"

namespace fsdp {

struct ReplicateOptions {
  DType init_dtype = DType::f32;  // dtype of the parameters created here
  uint64_t seed = 0;              // initialisation seed of the parameters created here
};

// The state replicate attaches to a module.
class ReplicateModule : public DataParallelModule {
 public:
  ReplicateModule(nn::Module& module, std::shared_ptr<dist::DeviceMesh> mesh,
                  const ReplicateOptions& options);

  std::shared_ptr<UnshardHandle> unshard(bool async = false) override;
  void reshard() override {}
  void set_requires_gradient_sync(bool sync) override { requires_sync_ = sync; }
  // One group: the flat buffers. With decay_1d false its 1-D parameters are no_decay ranges.
  std::vector<nn::ParamGroup> param_groups(double weight_decay, bool decay_1d = true) override;
  void zero_grad() override;
  std::shared_ptr<dist::ProcessGroup> shard_group() const override { return nullptr; }
  // The all-reduces' seconds on the mesh group's thread, and the seconds backward waited.
  CommStats comm_stats() const override;

  // The flat buffers behind the module's parameters and gradients.
  const nn::FlatParameters& flat() const { return flat_; }
  // The group the gradients are averaged over (the mesh's only dim).
  std::shared_ptr<dist::ProcessGroup> replicate_group() const { return mesh_->group(0); }

  // All-reduces the flat gradients; passes dx through unchanged.
  Tensor post_backward(nn::Module&, const Tensor& dx) override;

 private:
  std::shared_ptr<dist::DeviceMesh> mesh_;
  nn::FlatParameters flat_;
  std::vector<std::pair<int64_t, int64_t>> one_d_;  // [offset, numel) of each 1-D parameter
  bool requires_sync_ = true;
  double exposed_seconds_ = 0;
};

// Replicates `module` over a 1-D mesh, installing its hooks in the module's chain beside any
// others (a user's). Refused, by name, on a module replicated already or sharded by fully_shard,
// one inside a replicated or sharded module, and one with a fully_shard module inside it.
ReplicateModule& replicate(nn::Module& module, std::shared_ptr<dist::DeviceMesh> mesh,
                           ReplicateOptions options = {});

}  // namespace fsdp
