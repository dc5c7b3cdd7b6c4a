// A parameter group for the optimizers: one flat buffer of parameters and one
// of their gradients (1-D, contiguous, equal length), with its weight decay.
// It lives in nn so that both fsdp (which makes them) and optim (which steps
// them) can use it without breaking the layer order.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "fsdp/core/tensor.h"

namespace fsdp::nn {

struct ParamGroup {
  Tensor params, grads;  // grads undefined: a frozen group (no gradient, never stepped)
  double weight_decay = 0.01;
  // [offset, offset + count) ranges that get no weight decay (1-D parameters
  // under --wd-2d-only); empty: the whole buffer decays.
  std::vector<std::pair<int64_t, int64_t>> no_decay = {};
  // Makes grads hold this step's values before anything reads them: fully_shard's zero_grad
  // leaves them to the step's first reduce-scatter, and zeroes them here where none came (a block
  // the step skipped, with no sharded root above it to settle it). An optimizer or a norm calls
  // settle() before it reads grads. Empty: nothing to do.
  std::function<void()> settle_grads = {};
  void settle() const {
    if (settle_grads) settle_grads();
  }
};

}  // namespace fsdp::nn
