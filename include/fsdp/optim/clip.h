// Gradient clipping by the global norm, across shards: each rank sums the
// squares of its local gradient shards and one all-reduce over the shard
// group gives the global squared norm (replicas, as in HSDP's replicate dim,
// hold equal shards and are not summed twice). torch.nn.utils.clip_grad_norm_'s
// rule: scale by max_norm / (norm + 1e-6) when that is below 1.
#pragma once

#include <cmath>
#include <memory>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/param_group.h"

namespace fsdp::optim {

// The global squared norm, where the gradients live (one f64 on their device).
struct GradNorm {
  Tensor total_sq;
  double value() const { return std::sqrt(total_sq.item()); }  // a host read: a sync on CUDA
};

// Clips without a host round trip: the squared norms are summed on the device, all-reduced
// there (one f64, NCCL on CUDA) and read there by the scaling kernel. max_norm <= 0 only
// measures. shard_group may be null (nothing sharded).
GradNorm clip_grad_norm_async(const std::vector<nn::ParamGroup>& groups, double max_norm,
                              const std::shared_ptr<dist::ProcessGroup>& shard_group);
// The same, returning the global norm before clipping on the host.
double clip_grad_norm(const std::vector<nn::ParamGroup>& groups, double max_norm,
                      const std::shared_ptr<dist::ProcessGroup>& shard_group);

// torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) for a sharded model: every
// sharded gradient under `root`, over the shard group of its mesh.
GradNorm clip_grad_norm_async(FSDPModule& root, double max_norm);
double clip_grad_norm(FSDPModule& root, double max_norm);

}  // namespace fsdp::optim
