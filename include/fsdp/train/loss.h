// The loss a training step backpropagates, as a part a trainer hands to train_step
// (StepParts::loss): cross-entropy by default, fused with the head or not, or a trainer's own
// (examples/custom_trainer/zloss.cpp adds PaLM's z-loss) without copying the step.
//
// A loss sees one microbatch: the model's output (its logits [B, T, V], or, where the loss is
// fused into the model, the loss the model computed) and the targets [B, T] (kIgnoreIndex where a
// position is not one). It returns its value on the device, f64 [k] whose sum is the microbatch's
// share of the step's loss: the sum over its targets divided by LossArgs::divisor, which the step
// computes from every rank's count of targets, so that the losses and gradients of ranks and
// microbatches add up to the step's (train/step.h). backward() returns the gradient the model's
// backward takes, for d(step loss) / d(this loss) = LossArgs::scale.
//
// What a loss allocates while it runs (its forward to its backward) is the memory plan's "loss"
// term, named by describe() (train/memory_plan.h), so a loss with buffers of its own is planned.
// The plan runs the trainer's own loss object on the meta device first (two steps of tensors
// that hold no values): a loss must not read a tensor's values on the host there (the z-loss
// example skips its host math on meta tensors), and must not keep state from those calls that
// changes the run's steps.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/nn/loss.h"
#include "fsdp/nn/module.h"

namespace fsdp::train {

// What the step tells a loss about one microbatch.
struct LossArgs {
  double divisor = 0;  // the loss is the sum over the targets / divisor (0: by B x T)
  double scale = 1;    // d(step loss) / d(this loss): 1 / grad_accum
  bool fused = false;  // fused(model) said so: the output is the model's loss, not logits
};

class Loss {
 public:
  virtual ~Loss() = default;
  // Whether `model` computes this loss in its forward (nn::Module::fuses_loss, given the batch
  // context's targets): then forward() receives the model's loss and backward() returns no
  // gradient. Asked before each microbatch's forward.
  virtual bool fused(const nn::Module& model) const {
    (void)model;
    return false;
  }
  // Before the microbatch's training forward, with its batch on the device: a loss that needs a
  // forward of its own runs it here (a preference loss's reference: the model with its LoRA
  // adapters off, train/preference.h), with no backward. Default: nothing.
  virtual void prepare(nn::Module& model, const data::Batch& batch) {
    (void)model;
    (void)batch;
  }
  // output: the logits [B, T, V] (the model's loss when fused); targets [B, T]. Returns the
  // loss, f64 [k] on the output's device, whose sum is this microbatch's. Keeps what backward()
  // needs.
  virtual Tensor forward(const Tensor& output, const Tensor& targets, const LossArgs& a) = 0;
  // The gradient the model's backward takes (dlogits; undefined when fused), for d(loss) =
  // the forward's a.scale. Once per forward; drops what the forward kept.
  virtual Tensor backward() = 0;
  // Named values of the last forward beside the loss (a preference loss's rewards, with TRL's
  // names): f64 [metric_names().size()] on the output's device, each averaged over the step's
  // microbatches and ranks as the loss is. train_step gathers them with the loss, in the step's one
  // gather (no host sync of their own), into StepMetrics::named. Default: none.
  virtual std::vector<std::string> metric_names() const { return {}; }
  virtual Tensor metrics() const { return Tensor(); }
  // What it is, for the memory plan's table: "cross-entropy".
  virtual std::string describe() const = 0;
};

// Next-token cross-entropy. fused (fsdp-train's --fused-loss, StepOptions::fused_loss): where
// the model fuses_loss(), the head and the loss a chunk of rows at a time (nn::ChunkedLMLoss),
// never the [tokens x vocab] logits; else the logits, then nn::LMLoss, whose dlogits overwrite
// them. The default loss of train_step.
class CrossEntropy final : public Loss {
 public:
  explicit CrossEntropy(bool fused = true) : fused_(fused) {}
  bool fused(const nn::Module& model) const override { return fused_ && model.fuses_loss(); }
  Tensor forward(const Tensor& output, const Tensor& targets, const LossArgs& a) override;
  Tensor backward() override;
  std::string describe() const override;

 private:
  bool fused_;
  bool pending_fused_ = false;  // the last forward's output was the model's loss
  double scale_ = 1;
  nn::LMLoss unfused_;
};

}  // namespace fsdp::train
