// train_loop (fsdp/train/step.h): train_step over a run's steps, with evaluation, checkpoints,
// background writes and a stop signal, in the order fsdp-train's Trainer::fit runs them.
#include <cstdint>
#include <functional>
#include <optional>

#include "fsdp/checkpoint/manager.h"
#include "fsdp/core/error.h"
#include "fsdp/core/interrupt.h"
#include "fsdp/profiler/metrics.h"
#include "fsdp/train/step.h"

namespace fsdp::train {

namespace {

bool every(int64_t interval, int64_t steps_done, bool last) {
  return interval > 0 && (steps_done % interval == 0 || last);
}

}  // namespace

LoopResult train_loop(const StepParts& parts, const LoopOptions& o, const LoopHooks& hooks) {
  FSDP_CHECK(o.start >= 0 && o.eval_every >= 0 && o.save_every >= 0,
             "[train_loop] start {}, eval_every {} and save_every {} must not be negative", o.start,
             o.eval_every, o.save_every);
  const bool can_save = hooks.save || (parts.checkpointer && o.run);
  FSDP_CHECK(o.save_every == 0 || can_save,
             "[train_loop] save_every {} needs a save hook, or parts.checkpointer and "
             "LoopOptions::run",
             o.save_every);
  FSDP_CHECK(o.eval_every == 0 || hooks.evaluate,
             "[train_loop] eval_every {} needs LoopHooks::evaluate", o.eval_every);
  const auto save = [&](int64_t steps_done) {
    if (hooks.save)
      hooks.save(steps_done);
    else
      parts.checkpointer->save(steps_done, *o.run);
  };
  // A background write that finished (or failed: the same on every rank, from the step's gather)
  // is committed, or its error thrown, on every rank at the same step.
  const auto commit = [&](bool done, bool stopping) {
    if (!parts.checkpointer || parts.checkpointer->pending_step() < 0 || !done) return;
    if (hooks.commit)
      hooks.commit(stopping);
    else
      parts.checkpointer->wait();
  };
  StepOptions step_options = o.step;
  LoopResult r{.steps_done = o.start};
  for (int64_t s = o.start; s < o.steps; ++s) {
    if (hooks.on_step_begin) hooks.on_step_begin(s, step_options);
    profiler::StepMetrics m = train_step(parts, s, step_options);
    const bool last = s + 1 == o.steps;
    if (o.eval_every > 0 && every(o.eval_every, s + 1, last)) m.val_loss = hooks.evaluate(s);
    if (hooks.on_step_end)
      hooks.on_step_end(m);  // the step that learns of a failed write is logged
    commit(m.ckpt_write_failed || !m.ckpt_writing, false);
    const bool saved = can_save && every(o.save_every, s + 1, last);
    if (saved) save(s + 1);
    r.steps_done = s + 1;
    if (!last && m.stop) {
      const Uninterruptible stopping;  // the checkpoint is written whole
      if (can_save && !saved) save(s + 1);
      commit(true, true);
      if (hooks.on_stop) hooks.on_stop(m);
      r.stopped = true;
      break;
    }
  }
  commit(true, false);
  return r;
}

}  // namespace fsdp::train
