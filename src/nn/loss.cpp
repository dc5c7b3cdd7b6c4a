// The language-model loss.
#include "fsdp/nn/loss.h"

#include "fsdp/core/error.h"
#include "fsdp/ops/ops.h"

namespace fsdp::nn {

Tensor LMLoss::forward(const Tensor& logits, const Tensor& targets, double divisor) {
  FSDP_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                 logits.size(1) == targets.size(1),
             "[LMLoss] logits must be [B, T, V] and targets [B, T]; got {} and {}",
             shape_str(logits.shape()), shape_str(targets.shape()));
  shape_ = logits.shape();
  logits_ = logits.contiguous().view({shape_[0] * shape_[1], shape_[2]});
  targets_ = targets.contiguous().view({shape_[0] * shape_[1]});
  divisor_ = divisor;
  auto x = ops::cross_entropy_forward(logits_, targets_, /*read_loss=*/false, divisor);
  lse_ = x.lse;
  return x.loss_tensor;
}

Tensor LMLoss::backward(double scale) {
  FSDP_CHECK(logits_.defined(), "[LMLoss] backward() without forward(), or twice");
  Tensor d = ops::cross_entropy_backward_(logits_, targets_, lse_, scale, divisor_).view(shape_);
  logits_ = targets_ = lse_ = Tensor();
  return d;
}

}  // namespace fsdp::nn
