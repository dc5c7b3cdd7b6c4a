// train_step (fsdp/train/step.h): one optimizer step from a trainer's parts, with one host sync.
#include "fsdp/train/step.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/core/allocator.h"
#include "fsdp/core/error.h"
#include "fsdp/core/host_sync.h"
#include "fsdp/core/interrupt.h"
#include "fsdp/core/meta.h"
#include "fsdp/core/tensor.h"
#include "fsdp/nn/module.h"
#include "fsdp/optim/clip.h"
#include "fsdp/train/loss.h"

namespace fsdp::train {

// Batches reach the device from pinned memory, each prefetched while the one before it runs.
// The host waits for the device once: the metrics' gather (loss, grad norm, peak memory, the stop
// agreement and the checkpoint writers' state in one collective), before the optimizer may apply
// a non-finite update.
profiler::StepMetrics train_step(const StepParts& p, int64_t step, const StepOptions& o) {
  FSDP_CHECK(o.grad_accum >= 1, "[train_step] grad_accum must be at least 1, got {}",
             o.grad_accum);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t syncs0 = host_sync_count();
  if (p.schedule) p.optimizer.set_lr(p.schedule->at(step));
  const DataParallelModule::CommStats comm0 = p.parallel.comm_stats();
  p.parallel.zero_grad();
  // A masked source's loss is the sum over the step's targets on every rank, divided by their
  // count (not a mean of the ranks' or microbatches' means, which weighs a rank with few targets
  // as much as one with many). The count is the host's (the batches are read there), summed by
  // one host collective before the first microbatch: each microbatch divides by the count over
  // world x grad_accum, since the gradients' reduction averages over ranks and the backward's
  // 1 / grad_accum over microbatches. Unmasked, every position is a target: the mean over rows.
  double divisor = 0;
  int64_t targets = -1;
  if (p.loader.masks_targets()) {
    Tensor count = Tensor::full({1}, double(p.loader.count_targets(o.grad_accum)), DType::f64);
    p.group.all_reduce(count, dist::ReduceOp::SUM)->wait();
    const double total = count.data<double>()[0];  // a host tensor: no device wait
    targets = int64_t(total);
    // No target anywhere (every position ignored): a zero loss and zero gradients, and no step.
    divisor = total > 0 ? total / double(int64_t(p.group.size()) * o.grad_accum) : 1.0;
  }
  CrossEntropy default_loss(o.fused_loss);  // StepParts::loss null: fsdp-train's
  std::vector<Tensor> micro_losses, micro_metrics;  // on the device until the gather reads them
  int64_t tokens = 0;
  Device device = Device::cpu();
  for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
    // The gradients are reduced (reduce-scatter or all-reduce) in the last microbatch's backward.
    p.parallel.set_requires_gradient_sync(micro == o.grad_accum - 1);
    data::Batch b = p.loader.next();
    device = b.inputs.device();
    tokens += b.inputs.numel() * p.group.size();  // each rank holds as many rows
    // The loss stays on the device. Fused: the model's own, a chunk of rows at a time; else the
    // logits, then the loss (LMLoss's dlogits overwrite them).
    Loss& loss = p.loss ? *p.loss : default_loss;
    loss.prepare(p.model, b);  // a forward of the loss's own (a reference model's), no backward
    const bool fused = loss.fused(p.model);
    const nn::BatchContextScope context(p.model, {.doc_start = b.doc_start,  // packed rows
                                                  .targets = fused ? b.targets : Tensor(),
                                                  .loss_divisor = divisor,
                                                  .loss_scale = 1.0 / double(o.grad_accum),
                                                  .no_backward = false});
    {  // the logits and their gradient are freed before the next batch is made
      const Tensor output = p.model.forward(b.inputs);
      std::optional<meta::TermScope> own(meta::Term::loss);  // the plan's "loss": its own buffers
      micro_losses.push_back(loss.forward(
          output, b.targets,
          {.divisor = divisor, .scale = 1.0 / double(o.grad_accum), .fused = fused}));
      if (const Tensor named = loss.metrics(); named.defined()) micro_metrics.push_back(named);
      const Tensor dloss = loss.backward();
      own.reset();
      p.model.backward(dloss);
    }
    p.loader.prefetch();  // the next batch is made and copied while this one's kernels run
  }
  const DataParallelModule::CommStats comm1 = p.parallel.comm_stats();
  // The norm is measured here; the clipping is applied by the optimizer's step as it reads the
  // gradients (AdamW: one pass, no scaling pass of its own), after the check below.
  const optim::GradNorm norm =
      optim::clip_grad_norm_async(p.optimizer.param_groups(), 0, p.parallel.shard_group());
  // A stop signal reaches the ranks at different moments; all of them stop after the same step.
  profiler::StepMetrics m =
      profiler::gather_step_metrics(p.group, device,
                                    {.step = step,
                                     .losses = micro_losses,
                                     .metric_names = p.loss ? p.loss->metric_names()
                                                            : std::vector<std::string>(),
                                     .metrics = micro_metrics,
                                     .grad_norm_sq = norm.total_sq,
                                     .stop = stop_requested() != 0,
                                     .ckpt_write = p.checkpointer ? p.checkpointer->write_state() : 0,
                                     .lr = p.optimizer.lr(),
                                     .step_seconds = 1.0,  // the rates are divided below
                                     .tokens = tokens,
                                     .flops_per_token = o.flops_per_token,
                                     .peak_flops = o.peak_flops});
  FSDP_CHECK(std::isfinite(m.loss) && std::isfinite(m.grad_norm),
             "[train_step] step {}: loss {} and grad norm {} before the optimizer step; the "
             "weights were not updated and no checkpoint was written after the last good step. "
             "Lower the learning rate ({}) or clip the gradients, and check the data",
             step, m.loss, m.grad_norm, p.optimizer.lr());
  m.targets = targets;
  if (targets != 0) p.optimizer.step_clipped({.total_sq = norm.total_sq, .max_norm = o.grad_clip});
  m.host_syncs = host_sync_count() - syncs0;
  m.comm_seconds = comm1.comm_seconds - comm0.comm_seconds;
  m.exposed_seconds = comm1.exposed_seconds - comm0.exposed_seconds;
  m.all_gather_bytes = comm1.all_gather_bytes - comm0.all_gather_bytes;
  m.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.tokens_per_s /= m.step_seconds;
  m.mfu /= m.step_seconds;
  allocator_for(device).end_step();  // sizes this step did not ask for again leave the cache
  return m;
}

}  // namespace fsdp::train
