// Global-norm gradient clipping over sharded gradients.
#include "fsdp/optim/clip.h"

#include <cmath>

#include "fsdp/ops/ops.h"

namespace fsdp::optim {

double clip_grad_norm(const std::vector<nn::ParamGroup>& groups, double max_norm,
                      const std::shared_ptr<dist::ProcessGroup>& shard_group) {
  double local = 0;
  for (const auto& g : groups) local += ops::sum_squares(g.grads);
  double total = local;
  if (shard_group && shard_group->size() > 1) {
    Tensor t = Tensor::full({1}, local, DType::f64);
    shard_group->all_reduce(t, dist::ReduceOp::SUM)->wait();
    total = t.item();
  }
  const double norm = std::sqrt(total);
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0)
      for (const auto& g : groups) ops::scale_(g.grads, coef);
  }
  return norm;
}

}  // namespace fsdp::optim
