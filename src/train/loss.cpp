// train::CrossEntropy (fsdp/train/loss.h): train_step's default loss, fused into the model's
// forward (nn::ChunkedLMLoss) or over its logits (nn::LMLoss).
#include "fsdp/train/loss.h"

#include <memory>
#include <string>

#include "fsdp/core/tensor.h"

namespace fsdp::train {

Tensor CrossEntropy::forward(const Tensor& output, const Tensor& targets, const LossArgs& a) {
  scale_ = a.scale;
  pending_fused_ = a.fused;
  if (a.fused) return output;  // the model's own: the head and the loss a chunk at a time
  return unfused_.forward(output, targets, a.divisor);
}

Tensor CrossEntropy::backward() {
  if (pending_fused_) {  // the model's backward takes d(loss) from its batch context
    pending_fused_ = false;
    return Tensor();
  }
  return unfused_.backward(scale_);
}

std::string CrossEntropy::describe() const {
  return fused_ ? "cross-entropy, fused with the head" : "cross-entropy";
}

}  // namespace fsdp::train
