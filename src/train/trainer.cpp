// The training loop (fsdp/train/trainer.h): steps, validation, checkpoints, the profile window
// and the end of the run. Setup, resources, resume and reports are the other trainer_*.cpp.
#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/checkpoint/manager.h"
#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/core/interrupt.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/nn/module.h"
#include "fsdp/nn/moe.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/profiler/metrics.h"
#include "fsdp/profiler/tensorboard.h"
#include "fsdp/train/preference.h"
#include "fsdp/train/step.h"
#include "src/train/profile_window.h"
#include "src/train/trainer_impl.h"

namespace fsdp::train {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// After a step (train_step, fsdp/train/step.h: one host sync): the FLOP/s ceiling raised by the
// rates it saw, the stop grace, the communication totals the summary reports.
void Trainer::Impl::account(profiler::StepMetrics& m) {
  const double dt = m.step_seconds;
  // A stop signal ends a wait stuck on a peer, but only after a step in flight had its time.
  longest_step = std::max(longest_step, dt);
  set_stop_grace(std::chrono::milliseconds(int64_t(1000.0 * std::max(1.0, 2.0 * longest_step))));
  raise_peak(m);
  if (m.step > start_step || o.schedule.steps == start_step + 1) {  // the first step warms up
    comm_total += m.comm_seconds;
    exposed_total += m.exposed_seconds;
    gather_total += double(m.all_gather_bytes);
    step_total += dt;
    ++steps_timed;
  }
}

// The mean loss of eval_batches validation batches, over all ranks.
// One validation batch's loss: the sum over its targets / divisor (0: the mean over positions),
// fused as the training step's (no [tokens x vocab] logits) unless --fused-loss false.
double Trainer::Impl::eval_loss(const data::Batch& b, double divisor) {
  const bool fused = o.sharding.fused_loss && model->fuses_loss();
  const Tensor targets = b.targets.to(device);
  const nn::BatchContextScope context(
      *model, {.doc_start = b.doc_start.defined() ? b.doc_start.to(device) : Tensor(),
               .targets = fused ? targets : Tensor(),
               .loss_divisor = divisor,
               .loss_scale = 1.0,
               .no_backward = true});
  if (fused) {  // its chunks' shares, summed
    std::vector<double> parts = model->forward(b.inputs.to(device)).to(Device::cpu()).to_f64_vector();
    // An MoE's last chunk is the router's loss: the validation loss is the tokens' alone (as the
    // unfused path's), whatever the targets' weighting.
    if (!model->moe_layers().empty()) parts.pop_back();
    double sum = 0;
    for (double part : parts) sum += part;
    return sum;
  }
  Tensor logits = model->forward(b.inputs.to(device)).view({cfg.batch * cfg.seq, cfg.vocab});
  return ops::cross_entropy_forward(logits, targets, true, divisor).loss;
}

// The preference loss and its metrics (TRL's names with its "eval_" prefix) over eval_batches
// batches of validation pairs: each batch's value is its pairs' mean (the reference's forward and
// the policy's, neither with a backward), and every batch holds as many pairs, so the mean over
// batches and ranks is the mean over the pairs evaluated, at any world size.
double Trainer::Impl::evaluate_pairs(PreferenceLoss& pref) {
  const int64_t B = cfg.batch, T = cfg.seq;
  const std::vector<std::string> names = pref.metric_names();
  std::vector<double> sums(names.size() + 1, 0.0);
  for (int64_t e = 0; e < o.data.eval_batches; ++e) {
    data::Batch b = val->batch(e, B * size, rank * B, B, T);
    b.inputs = b.inputs.to(device), b.targets = b.targets.to(device);
    pref.prepare(*model, b);
    Tensor logits;
    {
      const nn::BatchContextScope context(*model, {.doc_start = Tensor(),
                                                   .targets = Tensor(),
                                                   .loss_divisor = 0,
                                                   .loss_scale = 1.0,
                                                   .no_backward = true});
      logits = model->forward(b.inputs);
    }
    sums[0] += pref.forward(logits, b.targets, {.divisor = 0, .scale = 1.0}).to_f64_vector()[0];
    const std::vector<double> m = pref.metrics().to_f64_vector();
    for (size_t i = 0; i < m.size(); ++i) sums[i + 1] += m[i];
    pref.release();
  }
  Tensor v = Tensor::from_vector(sums, {int64_t(sums.size())}).to(device);
  pg->all_reduce(v, dist::ReduceOp::AVG)->wait();
  const std::vector<double> mean = v.to_f64_vector();
  eval_named.clear();
  for (size_t i = 0; i < names.size(); ++i)
    eval_named.emplace_back("eval_" + names[i], mean[i + 1] / double(o.data.eval_batches));
  return mean[0] / double(o.data.eval_batches);
}

double Trainer::Impl::evaluate() {
  if (auto* pref = dynamic_cast<PreferenceLoss*>(parts.loss.get())) return evaluate_pairs(*pref);
  const int64_t B = cfg.batch, T = cfg.seq;
  if (val->masks_targets()) {
    // The summed loss over every rank's targets, divided by their count: a batch with few
    // targets weighs as little as it holds (not a mean of the batches' means).
    std::vector<double> sum_count(2, 0.0);
    for (int64_t e = 0; e < o.data.eval_batches; ++e) {
      data::Batch b = val->batch(e, B * size, rank * B, B, T);
      const int32_t* t = b.targets.data<int32_t>();
      for (int64_t i = 0; i < b.targets.numel(); ++i) sum_count[1] += t[i] != int32_t(kIgnoreIndex);
      if (b.doc_start.defined()) ops::check_doc_start(b.doc_start, B, T);
      sum_count[0] += eval_loss(b, 1.0);
    }
    Tensor v = Tensor::from_vector(sum_count, {2}).to(device);
    pg->all_reduce(v, dist::ReduceOp::SUM)->wait();
    const Tensor h = v.to(Device::cpu());
    const double count = h.data<double>()[1];
    return count > 0 ? h.data<double>()[0] / count : std::nan("");
  }
  double sum = 0;
  for (int64_t e = 0; e < o.data.eval_batches; ++e) {
    sum += eval_loss(val->batch(e, B * size, rank * B, B, T), 0.0);
  }
  Tensor v = Tensor::full({1}, sum / double(o.data.eval_batches), DType::f64).to(device);
  pg->all_reduce(v, dist::ReduceOp::AVG)->wait();
  return v.item();
}

void Trainer::Impl::save(int64_t step) {
  const Uninterruptible whole;  // a stop signal does not cut a checkpoint short (a second one does)
  const auto tc = std::chrono::steady_clock::now();
  if (main()) fmt::print("checkpoint: writing step {} to {} ...\n", step, o.checkpoint.ckpt_dir);
  checkpoint::Extras extras;  // its run id is the Manager's (the run's lineage)
  // The windows read over all ranks (part "data" too): a resume at any batch size or world size
  // goes on from the next one (checkpoints before saved the batch index).
  extras.data_position = loader->position();
  if (tokenizer) extras.files.emplace_back("tokenizer.json", tokenizer->json());
  if (tokenizer && model_tokenizer)  // the pretrained model's ids, chat template, pre-tokenizer
    extras.files.emplace_back("tokenizer_meta.json", pretrained->tokenizer_meta().to_json());
  if (main() && ckpt->pending_step() >= 0)  // a second save waits for the first
    fmt::print("checkpoint: waiting for the background write of step {}\n", ckpt->pending_step());
  ckpt->save(step, run_state(), extras);
  if (main() && o.checkpoint.async_checkpoint)
    fmt::print(
        "checkpoint: step {} copied in {:.3f} s (training blocked {:.3f} s); writing in "
        "the background\n",
        step, seconds_since(tc), ckpt->last_blocking_seconds());
  else if (main())
    fmt::print("checkpoint: done in {:.2f} s\n", seconds_since(tc));
}

// Collective: --async-checkpoint's pending save, committed (or its failure thrown on every rank).
void Trainer::Impl::finish_async_save() {
  if (!ckpt || ckpt->pending_step() < 0) return;
  const Uninterruptible whole;
  const int64_t step = ckpt->pending_step();
  const auto tc = std::chrono::steady_clock::now();
  ckpt->wait();
  if (main())
    fmt::print("checkpoint: step {} written in the background (committed after {:.3f} s more)\n",
               step, seconds_since(tc));
}

std::vector<std::pair<std::string, double>> Trainer::Impl::expert_load() {
  const std::vector<nn::MoE*>& layers = model->moe_layers();
  if (layers.empty()) return {};
  std::vector<double> pairs;  // [layers x E], this rank's tokens
  for (const nn::MoE* moe : layers) {
    FSDP_CHECK(moe->last_call(), "[fsdp-train] {} has run no forward", moe->describe());
    const std::vector<double>& c = moe->last_call()->pairs;
    pairs.insert(pairs.end(), c.begin(), c.end());
  }
  if (size > 1) {
    Tensor t = Tensor::from_vector(pairs, {int64_t(pairs.size())});
    pg->all_reduce(t, dist::ReduceOp::SUM)->wait();
    pairs = t.to_f64_vector();
  }
  std::vector<std::pair<std::string, double>> out;
  const auto experts = std::ptrdiff_t(cfg.moe.experts);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto [lo, hi] = std::minmax_element(pairs.begin() + std::ptrdiff_t(i) * experts,
                                              pairs.begin() + std::ptrdiff_t(i + 1) * experts);
    out.emplace_back("load_max/" + layers[i]->path(), *hi);
    out.emplace_back("load_min/" + layers[i]->path(), *lo);
  }
  return out;
}

// The step's scalars (and its validation loss) as TensorBoard events, flushed each step.
void Trainer::Impl::write_tensorboard(const profiler::StepMetrics& m) {
  const std::pair<const char*, double> scalars[] = {
      {"loss", m.loss},          {"lr", m.lr},           {"grad_norm", m.grad_norm},
      {"tok_s", m.tokens_per_s}, {"mfu", m.mfu},         {"peak_mem_gb", m.peak_mem_bytes / 1e9},
      {"step_ms", m.step_seconds * 1e3}};
  for (const auto& [tag, v] : scalars) tensorboard->scalar(tag, m.step, v);
  for (const auto& [tag, v] : m.named) tensorboard->scalar(tag, m.step, v);
  if (size > 1) tensorboard->scalar("comm_exposed_ms", m.step, m.exposed_seconds * 1e3);
  if (m.val_loss) tensorboard->scalar("val_loss", m.step, *m.val_loss);
  tensorboard->flush();
}

// train_loop (fsdp/train/step.h) with fsdp-train's hooks: the profile window, the step line and
// its ETA, validation, TensorBoard, the JSONL log, the checkpoints' messages and extras.
void Trainer::Impl::fit() {
  ProfileWindow profile(o.profile.profile_steps, o.profile.profile_dir, rank, device);
  steps_done = start_step;
  fit_start = std::chrono::steady_clock::now();
  auto iteration_start = fit_start;
  LoopHooks hooks;
  hooks.on_step_begin = [&](int64_t s, StepOptions& step) {
    profile.at_step(s);
    step.peak_flops = peak;  // raised by the steps before
    if (parts.on_step_begin) parts.on_step_begin(s);
  };
  // The experts' load is the training forward's: read before a validation forward replaces it.
  std::optional<std::vector<std::pair<std::string, double>>> load;
  if (val)
    hooks.evaluate = [&](int64_t) {
      load = expert_load();
      return evaluate();
    };
  hooks.on_step_end = [&](profiler::StepMetrics& m) {
    if (!load) load = expert_load();
    m.named.insert(m.named.end(), load->begin(), load->end());  // the line, TensorBoard, the log
    load.reset();
    account(m);
    const int64_t s = m.step;
    // The ETA: the mean wall time of the recent iterations (the step with its validation, log and
    // checkpoint), the first (a warm-up) dropped once others come; before any, this step's.
    const auto now = std::chrono::steady_clock::now();
    if (s > start_step) {
      if (s == start_step + 2) recent_steps.pop_front();
      recent_steps.push_back(std::chrono::duration<double>(now - iteration_start).count());
      if (recent_steps.size() > kEtaWindow) recent_steps.pop_front();
    }
    iteration_start = now;
    double mean = recent_steps.empty() ? m.step_seconds : 0;
    for (double d : recent_steps) mean += d / double(recent_steps.size());
    m.elapsed_seconds = seconds_since(fit_start);
    m.eta_seconds = mean * double(o.schedule.steps - s - 1);
    const uint64_t every = o.profile.log_every;
    if (main() && every > 0 && (uint64_t(s) % every == 0 || s + 1 == o.schedule.steps || m.stop)) {
      fmt::print("{}\n", m.line());
      std::fflush(stdout);
    }
    if (m.val_loss) {
      if (!best_val_loss || *m.val_loss < *best_val_loss) best_val_loss = m.val_loss;
      std::string named;  // a preference loss's metrics on the validation pairs
      for (const auto& [name, v] : eval_named) named += fmt::format(" | {} {:.4f}", name, v);
      if (main()) fmt::print("step {} | val loss {:.4f}{}\n", s, *m.val_loss, named);
      m.named.insert(m.named.end(), eval_named.begin(), eval_named.end());  // TensorBoard, log
    }
    if (tensorboard) write_tensorboard(m);
    if (log.is_open()) {
      log << m.json() << "\n";
      log.flush();
      const int err = errno;
      FSDP_CHECK(log.good(),
                 "[fsdp-train] writing --log-file '{}' failed at step {}: {}; stopping rather "
                 "than training on without the log",
                 o.profile.log_file, s, std::strerror(err));
    }
    steps_done = s + 1;
    if (parts.on_step_end) parts.on_step_end(m);
  };
  if (ckpt) {
    hooks.save = [&](int64_t step) { save(step); };
    hooks.commit = [&](bool stopping) {
      if (stopping && main())
        fmt::print(stderr, "fsdp-train: stopping: waiting for the background write of step {}\n",
                   ckpt->pending_step());
      finish_async_save();
    };
  }
  hooks.on_stop = [&](const profiler::StepMetrics& m) {
    const int sig = stop_requested();
    if (main())
      fmt::print(stderr, "fsdp-train: {} received: stopped after step {}{}\n",
                 sig == SIGINT    ? "SIGINT"
                 : sig == SIGTERM ? "SIGTERM"
                                  : "a stop signal",
                 m.step,
                 o.checkpoint.ckpt_dir.empty()
                     ? " (no --ckpt-dir: nothing saved)"
                     : fmt::format("; checkpoint of step {} in {}; continue with --resume",
                                   m.step + 1, o.checkpoint.ckpt_dir));
  };
  if (val && o.data.eval_at_start && start_step == 0) {  // llm.c's step-0 validation
    const double v = evaluate();
    std::string named;
    for (const auto& [name, x] : eval_named) named += fmt::format(" | {} {:.4f}", name, x);
    if (main()) fmt::print("step 0 | val loss {:.4f}{} (before training)\n", v, named);
  }
  steps_done = train_loop({.model = *model,
                           .parallel = *parallel,
                           .optimizer = *opt,
                           .loader = *loader,
                           .group = *pg,
                           .schedule = parts.schedule.get(),
                           .checkpointer = ckpt.get(),
                           .loss = parts.loss.get()},
                          {.start = start_step,
                           .steps = o.schedule.steps,
                           .step = {.grad_accum = o.sharding.grad_accum,
                                    .grad_clip = o.optimizer.grad_clip,
                                    .flops_per_token = double(cfg.flops_per_token()),
                                    .peak_flops = peak,
                                    .fused_loss = o.sharding.fused_loss},
                           .eval_every = val ? o.data.eval_every : 0,
                           .save_every = ckpt ? o.checkpoint.ckpt_every : 0},
                          hooks)
                   .steps_done;
  profile.finish();
  if (o.schedule.steps > 0) print_summary();
  if (!o.data.data.empty() && o.sample.sample_tokens > 0 && steps_done == o.schedule.steps)
    print_sample();
}

Trainer::Trainer(const TrainOptions& options, std::shared_ptr<dist::ProcessGroup> pg,
                 TrainerParts parts)
    : impl_(std::make_unique<Impl>(options, std::move(pg), std::move(parts))) {}
Trainer::~Trainer() = default;
void Trainer::fit() { impl_->fit(); }
int64_t Trainer::start_step() const { return impl_->start_step; }
int64_t Trainer::steps_done() const { return impl_->steps_done; }
nn::Transformer& Trainer::model() { return *impl_->model; }

}  // namespace fsdp::train
