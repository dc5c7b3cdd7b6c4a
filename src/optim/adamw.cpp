// AdamW over flat parameter groups.
#include "fsdp/optim/adamw.h"

namespace fsdp::optim {

AdamW::AdamW(std::vector<ParamGroup> groups, ops::AdamWHyper hyper) : groups_(std::move(groups)), hyper_(hyper) {
  for (const ParamGroup& g : groups_) {
    FSDP_CHECK(g.params.dim() == 1 && g.grads.shape() == g.params.shape() && g.params.is_contiguous() &&
                   g.grads.is_contiguous(),
               "[AdamW] a group needs 1-D contiguous params and grads of one length; got {} and {}",
               shape_str(g.params.shape()), shape_str(g.grads.shape()));
    exp_avg_.push_back(Tensor::zeros(g.params.shape(), g.params.dtype(), g.params.device()));
    exp_avg_sq_.push_back(Tensor::zeros(g.params.shape(), g.params.dtype(), g.params.device()));
  }
}

void AdamW::step() {
  ++step_;
  for (size_t i = 0; i < groups_.size(); ++i) {
    ops::AdamWHyper h = hyper_;
    h.weight_decay = groups_[i].weight_decay;
    ops::adamw_(groups_[i].params, groups_[i].grads, exp_avg_[i], exp_avg_sq_[i], h, step_);
  }
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i) b += int64_t(exp_avg_[i].nbytes() + exp_avg_sq_[i].nbytes());
  return b;
}

}  // namespace fsdp::optim
