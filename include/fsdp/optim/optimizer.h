// The optimizer interface. An optimizer steps flat parameter groups (under
// fully_shard, the local shards: FSDPModule::param_groups()) and keeps its
// per-element state beside them. The state of a group is found by the group's
// parameter buffer, never by its position, so a checkpoint or a trainer can
// ask for it without knowing the optimizer's order or its type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/nn/param_group.h"
#include "fsdp/ops/ops.h"

namespace fsdp::optim {

using ParamGroup = nn::ParamGroup;

class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {}
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One step over every group with the current learning rate.
  virtual void step() = 0;
  // One step with the gradients clipped: ops::clip_scale_(grads, clip.total_sq, clip.max_norm)
  // over every group, then step(). An optimizer may instead scale each gradient as it reads it
  // (AdamW does, leaving the gradients unscaled), with the same bits.
  virtual void step_clipped(const ops::GradClip& clip);
  // Zeroes every group's gradient buffer (with fully_shard, model.zero_grad() does the same).
  void zero_grad();
  virtual void set_lr(double lr) = 0;
  virtual double lr() const = 0;
  virtual int64_t step_count() const = 0;
  virtual void set_step_count(int64_t step) = 0;
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // The per-element state of the group whose parameter buffer is `params` (each tensor laid
  // out as the buffer), by name: AdamW's "exp_avg" and "exp_avg_sq". Throws when no group of
  // this optimizer holds that buffer.
  virtual std::vector<std::pair<std::string, Tensor>> state(const Tensor& params) const = 0;

 protected:
  // The index of the group whose parameter buffer is `params`.
  size_t group_of(const Tensor& params) const;

  std::vector<ParamGroup> groups_;
};

// How a trainer makes its optimizer over a model's parameter groups (train::TrainerParts): the
// memory plan calls it too, over the meta model's groups, so the state it plans is the state
// that optimizer keeps.
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup> groups)>;

}  // namespace fsdp::optim
