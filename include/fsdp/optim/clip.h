// Gradient clipping by the global norm, across shards: each rank sums the
// squares of its local gradient shards and one all-reduce over the shard
// group gives the global squared norm (replicas, as in HSDP's replicate dim,
// hold equal shards and are not summed twice). torch.nn.utils.clip_grad_norm_'s
// rule: scale by max_norm / (norm + 1e-6) when that is below 1.
#pragma once

#include <memory>
#include <vector>

#include "fsdp/dist/process_group.h"
#include "fsdp/nn/param_group.h"

namespace fsdp::optim {

// Returns the global norm before clipping. max_norm <= 0 only measures.
// shard_group may be null (nothing sharded).
double clip_grad_norm(const std::vector<nn::ParamGroup>& groups, double max_norm,
                      const std::shared_ptr<dist::ProcessGroup>& shard_group);

}  // namespace fsdp::optim
