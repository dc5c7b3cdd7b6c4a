// Learning-rate schedules.
#include "fsdp/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "fsdp/core/error.h"

namespace fsdp::optim {

Decay parse_decay(const std::string& s) {
  if (s == "none" || s == "constant") return Decay::constant;
  if (s == "cosine") return Decay::cosine;
  if (s == "linear") return Decay::linear;
  FSDP_FAIL("[lr_schedule] unknown decay '{}'; expected none, cosine or linear", s);
}

LRSchedule::LRSchedule(LRScheduleOptions o) : o_(o) {
  FSDP_CHECK(o_.lr >= 0 && o_.min_lr >= 0, "[lr_schedule] lr {} and min_lr {} must be >= 0", o_.lr,
             o_.min_lr);
  FSDP_CHECK(o_.warmup >= 0 && o_.decay_end >= 0,
             "[lr_schedule] warmup {} and decay_end {} must be >= 0", o_.warmup, o_.decay_end);
}

double LRSchedule::at(int64_t step) const {
  if (step < o_.warmup) return o_.lr * double(step + 1) / double(o_.warmup + 1);
  if (o_.decay == Decay::constant) return o_.lr;
  const int64_t span = o_.decay_end - o_.warmup;
  const double ratio =
      span > 0 ? std::clamp(double(step - o_.warmup) / double(span), 0.0, 1.0) : 1.0;
  if (o_.decay == Decay::cosine)
    return o_.min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (o_.lr - o_.min_lr);
  return o_.lr - ratio * (o_.lr - o_.min_lr);
}

}  // namespace fsdp::optim
