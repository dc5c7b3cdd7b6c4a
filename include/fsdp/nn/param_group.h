// A parameter group for the optimizers: one flat buffer of parameters and one
// of their gradients (1-D, contiguous, equal length), with its weight decay.
// It lives in nn so that both fsdp (which makes them) and optim (which steps
// them) can use it without breaking the layer order.
#pragma once

#include <cstdint>
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
};

}  // namespace fsdp::nn
