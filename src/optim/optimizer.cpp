// The optimizer interface's shared part.
#include "fsdp/optim/optimizer.h"

#include <memory>

#include "fsdp/core/error.h"
#include "fsdp/ops/ops.h"

namespace fsdp::optim {

void Optimizer::zero_grad() {
  for (const ParamGroup& g : groups_)
    if (g.grads.defined()) g.grads.zero_();
}

void Optimizer::step_clipped(const ops::GradClip& clip) {
  if (clip.total_sq.defined() && clip.max_norm > 0)
    for (const ParamGroup& g : groups_)
      if (g.grads.defined()) {
        g.settle();
        ops::clip_scale_(g.grads, clip.total_sq, clip.max_norm);
      }
  step();
}

size_t Optimizer::group_of(const Tensor& params) const {
  for (size_t i = 0; i < groups_.size(); ++i)
    if (groups_[i].params.raw_data() == params.raw_data() &&
        groups_[i].params.numel() == params.numel())
      return i;
  FSDP_FAIL("[optimizer] no group of this optimizer holds the {} parameters asked for ({} groups)",
            shape_str(params.shape()), groups_.size());
}

}  // namespace fsdp::optim
