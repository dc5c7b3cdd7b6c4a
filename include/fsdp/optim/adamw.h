// AdamW with torch.optim.AdamW's semantics (decoupled weight decay, bias
// correction), fused and multi-tensor: every group (each one flat buffer) in one
// pass, ops::adamw_multi_ (one OpenMP region on the CPU, one launch per 48
// tensors on CUDA), with global-norm clipping's factor applied as it reads.
// State (exp_avg, exp_avg_sq) has the dtype of the parameters it steps, f32
// for the usual f32 master weights. Under fully_shard the groups
// are the local shards, so the state is sharded too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/nn/param_group.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/optimizer.h"

namespace fsdp::optim {

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, ops::AdamWHyper hyper);
  void step() override;
  // Reads each gradient once: clipping's factor is applied in AdamW's own pass.
  void step_clipped(const ops::GradClip& clip) override;
  void set_lr(double lr) override { hyper_.lr = lr; }
  double lr() const override { return hyper_.lr; }
  int64_t step_count() const override { return step_; }
  void set_step_count(int64_t step) override { step_ = step; }
  // "exp_avg" and "exp_avg_sq" of the group whose parameters are `params`.
  std::vector<std::pair<std::string, Tensor>> state(const Tensor& params) const override;
  // The first and second moments of group i (same layout as its params).
  const Tensor& exp_avg(size_t i) const { return exp_avg_.at(i); }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_.at(i); }
  size_t num_groups() const { return groups_.size(); }
  // Bytes of optimizer state (exp_avg and exp_avg_sq of every group).
  int64_t state_bytes() const;

 private:
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  ops::AdamWHyper hyper_;
  int64_t step_ = 0;
};

}  // namespace fsdp::optim
