// Global-norm gradient clipping over sharded gradients.
#include "fsdp/optim/clip.h"

#include <cmath>

#include "fsdp/ops/ops.h"

namespace fsdp::optim {

GradNorm clip_grad_norm_async(const std::vector<nn::ParamGroup>& groups, double max_norm,
                              const std::shared_ptr<dist::ProcessGroup>& shard_group) {
  // Frozen groups (no gradient: a LoRA base) are not part of the norm.
  const Device device = groups.empty() ? Device::cpu() : groups.front().params.device();
  Tensor total = Tensor::zeros({1}, DType::f64, device);
  for (const auto& g : groups)
    if (g.grads.defined()) {
      g.settle();
      ops::sum_squares_into(g.grads, total);
    }
  if (shard_group && shard_group->size() > 1)
    shard_group->all_reduce(total, dist::ReduceOp::SUM)->wait();  // on CUDA: a stream wait
  if (max_norm > 0)
    for (const auto& g : groups)
      if (g.grads.defined()) ops::clip_scale_(g.grads, total, max_norm);
  return {total};
}

double clip_grad_norm(const std::vector<nn::ParamGroup>& groups, double max_norm,
                      const std::shared_ptr<dist::ProcessGroup>& shard_group) {
  return clip_grad_norm_async(groups, max_norm, shard_group).value();
}

GradNorm clip_grad_norm_async(FSDPModule& root, double max_norm) {
  return clip_grad_norm_async(root.param_groups(0), max_norm, root.shard_group());
}

double clip_grad_norm(FSDPModule& root, double max_norm) {
  return clip_grad_norm_async(root, max_norm).value();
}

}  // namespace fsdp::optim
