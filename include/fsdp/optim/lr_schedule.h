// Learning-rate schedules that drive any optimizer with set_lr(): linear
// warmup to the peak over `warmup` steps, then constant, cosine or linear
// decay to `min_lr` at step `decay_end` (and `min_lr` after). torchtitan's
// and llm.c's shapes; the warmup starts at lr / (warmup + 1), not at 0, so
// step 0 already trains.
//
//   optim::LRSchedule sched({.lr = 3e-4, .warmup = 100, .decay = optim::Decay::cosine,
//                            .min_lr = 3e-5, .decay_end = 10000});
//   for (step ...) { opt.set_lr(sched.at(step)); ... opt.step(); }
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::optim {

enum class Decay { constant, cosine, linear };
// "none" or "constant", "cosine", "linear"; throws on anything else, naming it.
Decay parse_decay(const std::string& s);

struct LRScheduleOptions {
  double lr = 3e-4;    // the peak, reached at the end of the warmup
  int64_t warmup = 0;  // steps
  Decay decay = Decay::constant;
  double min_lr = 0.0;    // where cosine and linear decay end
  int64_t decay_end = 0;  // the step at which the decay reaches min_lr
};

// What sets an optimizer's learning rate at each step (train::StepParts::schedule): LRSchedule,
// or a trainer's own.
class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual double at(int64_t step) const = 0;  // the learning rate of `step`
};

class LRSchedule final : public Schedule {
 public:
  explicit LRSchedule(LRScheduleOptions o);  // throws on a negative rate or step count
  double at(int64_t step) const override;
  const LRScheduleOptions& options() const { return o_; }

 private:
  LRScheduleOptions o_;
};

}  // namespace fsdp::optim
