// AdamW over flat parameter groups.
#include "fsdp/optim/adamw.h"

#include <memory>
#include <utility>
#include <vector>

#include "fsdp/core/trace.h"

namespace fsdp::optim {

AdamW::AdamW(std::vector<ParamGroup> groups, ops::AdamWHyper hyper)
    : Optimizer(std::move(groups)), hyper_(hyper) {
  for (const ParamGroup& g : groups_) {
    if (!g.grads.defined()) {  // frozen: never stepped, no state
      exp_avg_.emplace_back();
      exp_avg_sq_.emplace_back();
      continue;
    }
    FSDP_CHECK(g.params.dim() == 1 && g.grads.shape() == g.params.shape() &&
                   g.params.is_contiguous() && g.grads.is_contiguous(),
               "[AdamW] a group needs 1-D contiguous params and grads of one length; got {} and {}",
               shape_str(g.params.shape()), shape_str(g.grads.shape()));
    exp_avg_.push_back(Tensor::zeros(g.params.shape(), g.params.dtype(), g.params.device()));
    exp_avg_sq_.push_back(Tensor::zeros(g.params.shape(), g.params.dtype(), g.params.device()));
  }
}

void AdamW::step() { step_clipped({}); }

// Every group's update in one multi-tensor pass (one per dtype and device), the runs of a group
// that alternate between decayed and undecayed ranges as tensors of their own.
void AdamW::step_clipped(const ops::GradClip& clip) {
  trace::Scope prof("Optimizer.step#AdamW.step", trace::Kind::annotation);
  ++step_;
  std::vector<std::vector<ops::AdamWTensors>> batches;  // one per (dtype, device)
  auto add = [&](const ParamGroup& g, size_t i, int64_t b, int64_t e, double wd) {
    if (e <= b) return;
    ops::AdamWTensors t{g.params.slice(b, e), g.grads.slice(b, e), exp_avg_[i].slice(b, e),
                        exp_avg_sq_[i].slice(b, e), wd};
    for (auto& batch : batches)
      if (batch.front().param.dtype() == t.param.dtype() &&
          batch.front().param.device() == t.param.device()) {
        batch.push_back(std::move(t));
        return;
      }
    batches.push_back({std::move(t)});
  };
  for (size_t i = 0; i < groups_.size(); ++i) {
    const ParamGroup& g = groups_[i];
    if (!g.grads.defined()) continue;  // frozen
    g.settle();
    int64_t at = 0;
    for (auto [off, count] : g.no_decay) {
      add(g, i, at, off, g.weight_decay);
      add(g, i, off, off + count, 0.0);
      at = off + count;
    }
    add(g, i, at, g.params.numel(), g.weight_decay);
  }
  for (const auto& batch : batches) ops::adamw_multi_(batch, hyper_, step_, clip);
}

std::vector<std::pair<std::string, Tensor>> AdamW::state(const Tensor& params) const {
  const size_t i = group_of(params);
  if (!exp_avg_[i].defined()) return {};  // a frozen group has none
  return {{"exp_avg", exp_avg_[i]}, {"exp_avg_sq", exp_avg_sq_[i]}};
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i)
    if (exp_avg_[i].defined()) b += int64_t(exp_avg_[i].nbytes() + exp_avg_sq_[i].nbytes());
  return b;
}

}  // namespace fsdp::optim
