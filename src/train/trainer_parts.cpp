// Trainer::Impl's parts (fsdp/train/trainer.h's TrainerParts): those the caller handed in are
// kept; the rest are built from the options, as fsdp-train's. The memory plan then plans the loss
// and the optimizer held here, whichever they are.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/nn/param_group.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/optim/optimizer.h"
#include "fsdp/train/loss.h"
#include "fsdp/train/preference.h"
#include "src/train/trainer_impl.h"

namespace fsdp::train {

void Trainer::Impl::fill_parts() {
  if (!parts.loss && !o.preference.preference.empty())  // pairs: the preference loss
    parts.loss = std::make_shared<PreferenceLoss>(
        PreferenceConfig{.kind = parse_preference_kind(o.preference.preference),
                         .beta = o.preference.pref_beta,
                         .label_smoothing = o.preference.pref_label_smoothing,
                         .simpo_gamma = o.preference.pref_simpo_gamma,
                         .reference_adapters_off = true});
  // --pref-precompute-ref: the batches carry the reference's log-probs (precompute_reference).
  if (auto* pref = dynamic_cast<PreferenceLoss*>(parts.loss.get()))
    pref->set_precomputed(o.preference.pref_precompute_ref && pref->needs_reference());
  if (!parts.loss) parts.loss = std::make_shared<CrossEntropy>(o.sharding.fused_loss);
  given_optimizer = bool(parts.optimizer);
  if (!parts.optimizer)
    parts.optimizer = [hyper = ops::AdamWHyper{.lr = o.optimizer.lr,
                                               .beta1 = o.optimizer.beta1,
                                               .beta2 = o.optimizer.beta2,
                                               .eps = o.optimizer.eps,
                                               .weight_decay = o.optimizer.weight_decay}](
                          std::vector<nn::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
      return std::make_unique<optim::AdamW>(std::move(groups), hyper);
    };
  if (!parts.schedule)
    parts.schedule = std::make_shared<optim::LRSchedule>(optim::LRScheduleOptions{
        .lr = o.optimizer.lr,
        .warmup = o.schedule.warmup_steps,
        .decay = o.schedule.lr_decay,
        .min_lr = o.schedule.min_lr,
        .decay_end = o.schedule.decay_steps > 0 ? o.schedule.decay_steps : o.schedule.steps});
}

}  // namespace fsdp::train
