// The language-model loss: next-token cross-entropy of logits [B, T, V]
// against targets [B, T], summed over the targets that are not kIgnoreIndex and divided by the
// divisor (0: by B x T, the mean over positions). The loss stays on the logits' device (one f64), so
// a CUDA step needs no host sync for it; backward() writes dlogits over the
// logits, as llm.c does, so the largest activation of the model needs no
// second buffer.
//
//   nn::LMLoss loss;
//   Tensor l = loss.forward(model.forward(inputs), targets);  // f64 [1]
//   model.backward(loss.backward());  // dlogits [B, T, V], in the logits' place
//   ... l.item() when printing.
#pragma once

#include "fsdp/core/tensor.h"

namespace fsdp::nn {

class LMLoss {
 public:
  // Saves the logits (which backward() overwrites) and the row log-sum-exps. A trainer that
  // masks targets passes its count of them per rank and microbatch (train_step does).
  Tensor forward(const Tensor& logits, const Tensor& targets, double divisor = 0);
  // dlogits for d(loss) = scale (1 / K to average over K accumulated micro-batches); once.
  Tensor backward(double scale = 1.0);

 private:
  Tensor logits_, targets_, lse_;
  Shape shape_;
  double divisor_ = 0;
};

}  // namespace fsdp::nn
