// The preference losses (fsdp/train/preference.h): per-row log-probs from the logits on the host,
// the pairs' losses and their derivatives wrt each row's log-prob, then dlogits over the logits.
#include "fsdp/train/preference.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/core/tensor.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/module.h"

namespace fsdp::train {

namespace {


double log_sigmoid(double x) { return x > 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
double sigmoid(double x) { return std::exp(log_sigmoid(x)); }

// Each target position's log-sum-exp into lse and log-softmax at its target into at (both 0 where
// t[p] is kIgnoreIndex).
template <typename T>
void position_logps(const T* x, const int32_t* t, int64_t positions, int64_t vocab, double* lse,
                    double* at) {
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < positions; ++p) {
    lse[p] = 0, at[p] = 0;
    if (t[p] == int32_t(kIgnoreIndex)) continue;
    const T* row = x + p * vocab;
    double max = double(row[0]), sum = 0;
    for (int64_t v = 1; v < vocab; ++v) max = std::max(max, double(row[v]));
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - max);
    lse[p] = max + std::log(sum);
    at[p] = double(row[t[p]]) - lse[p];
  }
}

// The rows' sums of at over their targets t (and each row's count of them).
std::vector<double> row_sums(const double* at, const int32_t* t, int64_t rows, int64_t seq,
                             std::vector<int64_t>* counts) {
  std::vector<double> out(size_t(rows), 0.0);
  if (counts) counts->assign(size_t(rows), 0);
  for (int64_t p = 0; p < rows * seq; ++p) {
    if (t[p] == int32_t(kIgnoreIndex)) continue;
    out[size_t(p / seq)] += at[p];
    if (counts) ++(*counts)[size_t(p / seq)];
  }
  return out;
}

template <typename T>
std::vector<double> logps_of(const T* x, const int32_t* t, int64_t rows, int64_t seq, int64_t vocab,
                             double* lse, std::vector<int64_t>* counts) {
  std::vector<double> at(size_t(rows * seq));
  position_logps(x, t, rows * seq, vocab, lse, at.data());
  return row_sums(at.data(), t, rows, seq, counts);
}

// dlogits = coef[p] (onehot(t[p]) - softmax) at the target positions, 0 elsewhere, in place.
template <typename T>
void dlogits_of(T* x, const int32_t* t, int64_t positions, int64_t vocab, const double* lse,
                const std::vector<double>& coef) {
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < positions; ++p) {
    T* row = x + p * vocab;
    if (t[p] == int32_t(kIgnoreIndex)) {
      std::fill(row, row + vocab, T(0));
      continue;
    }
    const double k = coef[size_t(p)];
    for (int64_t v = 0; v < vocab; ++v) row[v] = T(-k * std::exp(double(row[v]) - lse[p]));
    row[t[p]] += T(k);
  }
}

// log(1 - exp(x)) for x < 0, TRL's log1mexp (the branch at -log 2 avoids cancellation).
double log1mexp(double x) {
  return x < -0.6931471805599453 ? std::log1p(-std::exp(x)) : std::log(-std::expm1(x));
}

void check_targets(const Tensor& logits, const Tensor& targets, int64_t* rows, int64_t* seq) {
  FSDP_CHECK(targets.dim() == 2, "[preference] targets must be [B, T], got {} dims", targets.dim());
  *rows = targets.size(0), *seq = targets.size(1);
  const int64_t vocab = logits.size(logits.dim() - 1);
  FSDP_CHECK(logits.numel() == *rows * *seq * vocab,
             "[preference] logits of {} values for targets [{}, {}] and vocab {}", logits.numel(),
             *rows, *seq, vocab);
}

}  // namespace

PreferenceKind parse_preference_kind(const std::string& name) {
  if (name == "dpo") return PreferenceKind::dpo;
  if (name == "ipo") return PreferenceKind::ipo;
  if (name == "simpo") return PreferenceKind::simpo;
  if (name == "orpo") return PreferenceKind::orpo;
  FSDP_FAIL("[preference] --preference '{}': expected dpo, ipo, simpo or orpo", name);
}

const char* preference_kind_name(PreferenceKind kind) {
  switch (kind) {
    case PreferenceKind::dpo: return "dpo";
    case PreferenceKind::ipo: return "ipo";
    case PreferenceKind::simpo: return "simpo";
    default: return "orpo";
  }
}

std::vector<double> row_target_logps(const Tensor& logits, const Tensor& targets,
                                     std::vector<int64_t>* counts) {
  int64_t rows = 0, seq = 0;
  check_targets(logits, targets, &rows, &seq);
  FSDP_CHECK(logits.device().is_cpu() && targets.device().is_cpu(),
             "[preference] the log-probs are computed on the host; the logits are on {}",
             logits.device().str());
  const int64_t vocab = logits.size(logits.dim() - 1);
  const Tensor tc = targets.contiguous().to(DType::i32);
  std::vector<double> lse(size_t(rows * seq));
  if (logits.dtype() == DType::f64) {
    const Tensor l = logits.contiguous();
    return logps_of(l.data<double>(), tc.data<int32_t>(), rows, seq, vocab, lse.data(), counts);
  }
  const Tensor l = logits.dtype() == DType::f32 ? logits.contiguous() : logits.to(DType::f32);
  return logps_of(l.data<float>(), tc.data<int32_t>(), rows, seq, vocab, lse.data(), counts);
}

PreferenceLoss::PreferenceLoss(PreferenceConfig config) : config_(config) {
  FSDP_CHECK(config_.beta > 0, "[preference] --pref-beta must be positive, got {}", config_.beta);
  FSDP_CHECK(config_.label_smoothing >= 0 && config_.label_smoothing < 0.5,
             "[preference] --pref-label-smoothing must be in [0, 0.5), got {}",
             config_.label_smoothing);
  FSDP_CHECK(config_.kind == PreferenceKind::dpo || config_.kind == PreferenceKind::simpo ||
                 config_.label_smoothing == 0,
             "[preference] --preference {} takes no label smoothing (got {})",
             preference_kind_name(config_.kind), config_.label_smoothing);
}

std::vector<std::string> PreferenceLoss::metric_names() const {
  std::vector<std::string> names{"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                 "rewards/margins", "logps/chosen", "logps/rejected"};
  if (config_.kind == PreferenceKind::orpo)
    names.insert(names.end(), {"nll_loss", "log_odds_ratio", "log_odds_chosen"});
  return names;
}

void PreferenceLoss::set_inputs(const Tensor& inputs) {
  inputs_ = inputs.device().is_meta() ? inputs : inputs.contiguous().to(DType::i32);
}

void PreferenceLoss::prepare(nn::Module& model, const data::Batch& batch) {
  if (config_.kind == PreferenceKind::orpo) set_inputs(batch.inputs);
  if (!needs_reference()) return;
  if (precomputed_) {  // the batch's rows carry them (PreferenceSource::set_reference)
    const int64_t rows = batch.targets.size(0);
    FSDP_CHECK(int64_t(batch.reference_logps.size()) == rows || batch.inputs.device().is_meta(),
               "[preference] {}: the reference log-probs are precomputed, but the batch of {} "
               "rows carries {} (a PreferenceSource given them by set_reference)",
               preference_kind_name(config_.kind), rows, batch.reference_logps.size());
    reference_ = batch.reference_logps;
    if (reference_.empty()) reference_.assign(size_t(rows), 0.0);  // the memory plan's
    return;
  }
  if (!config_.reference_adapters_off && !reference_model_) return;
  // The memory plan's steps run the meta copy it made (MemoryPlanOptions::reference).
  nn::Module& ref = reference_model_ ? *reference_model_ : model;
  // Adapters off must leave another model (the meta plan may run before the reference exists).
  if (!reference_model_ && !checked_adapters_ && !batch.inputs.device().is_meta()) {
    const auto named = model.named_parameters();
    FSDP_CHECK(std::any_of(named.begin(), named.end(),
                           [](const auto& p) { return p.first.find("lora_B") != std::string::npos; }),
               "[preference] the {} reference is the model with its LoRA adapters off, but the "
               "model has none: the policy would be its own reference (give a reference model: "
               "set_reference_model, fsdp-train's frozen copy or --pref-reference)",
               preference_kind_name(config_.kind));
    checked_adapters_ = true;
  }
  const nn::LoraDisabledScope base;  // the policy's reference: the frozen base, adapters off
  // A model of its own (no backward, no records kept) frees its root's gathered parameters now
  // rather than through the policy's step; the policy (adapters off) keeps them for its forward.
  reference_ = reference_row_logps(ref, batch, &ref != &model);
}

std::vector<double> reference_row_logps(nn::Module& model, const data::Batch& batch,
                                        bool reshard) {
  Tensor logits;
  {
    const nn::BatchContextScope context(model, {.doc_start = batch.doc_start,
                                                .targets = Tensor(),
                                                .loss_divisor = 0,
                                                .loss_scale = 1,
                                                .loss_chunk_logits = 0,
                                                .no_backward = true});
    logits = model.forward(batch.inputs);
  }
  if (reshard)
    if (FSDPModule* sharded = fsdp_state(model)) sharded->reshard();
  if (logits.device().is_meta())  // the memory plan: shapes only
    return std::vector<double>(size_t(batch.targets.size(0)), 0.0);
  return row_target_logps(logits, batch.targets);
}

// ORPO's NLL targets: on each chosen row (even), every position up to its last reply target
// predicts the next input token (the prompt's and the reply's, as TRL's ORPO labels the whole
// chosen sequence); other rows keep their reply targets.
std::vector<int32_t> PreferenceLoss::nll_targets(const Tensor& targets, int64_t rows,
                                                 int64_t seq) const {
  FSDP_CHECK(inputs_.defined() && inputs_.dim() == 2 && inputs_.size(0) == rows &&
                 inputs_.size(1) == seq,
             "[preference] orpo: the microbatch's inputs [{}, {}] (prepare() or set_inputs() "
             "before each forward)", rows, seq);
  const int32_t* in = inputs_.data<int32_t>();
  const int32_t* tg = targets.data<int32_t>();
  std::vector<int32_t> out(tg, tg + rows * seq);
  for (int64_t r = 0; r < rows; r += 2) {
    int64_t last = seq - 1;
    while (last >= 0 && tg[r * seq + last] == int32_t(kIgnoreIndex)) --last;
    for (int64_t t = 0; t < last; ++t) {
      int32_t& target = out[size_t(r * seq + t)];
      if (target == int32_t(kIgnoreIndex)) target = in[r * seq + t + 1];
    }
  }
  return out;
}

Tensor PreferenceLoss::forward(const Tensor& output, const Tensor& targets, const LossArgs& a) {
  FSDP_CHECK(!a.fused, "[preference] the loss needs the logits; the model fused its own loss");
  int64_t rows = 0, seq = 0;
  check_targets(output, targets, &rows, &seq);
  const int64_t vocab = output.size(output.dim() - 1);
  FSDP_CHECK(rows % 2 == 0, "[preference] {} rows: a microbatch holds whole pairs (chosen, "
             "rejected), so its rows must be even", rows);
  const Device device = output.device();
  FSDP_CHECK(device.is_cpu() || device.is_meta(),
             "[preference] the log-probs are computed on the host (CPU runs); the logits are on {}",
             device.str());
  const int64_t pairs = rows / 2, positions = rows * seq;
  const bool orpo = config_.kind == PreferenceKind::orpo;
  out_dtype_ = output.dtype();
  out_shape_ = output.shape();
  logits_ = output.dtype() == DType::f64 || output.dtype() == DType::f32
                ? output.contiguous().view({positions, vocab})
                : output.to(DType::f32).view({positions, vocab});
  lse_ = Tensor::empty({positions}, DType::f64, device);
  targets_ = Tensor::empty({rows, seq}, DType::i32, device);
  Tensor out = Tensor::empty({1}, DType::f64, device);
  metrics_ = Tensor::empty({int64_t(metric_names().size())}, DType::f64, device);
  if (device.is_meta()) {
    inputs_ = Tensor();
    return out;
  }
  const Tensor tc = targets.contiguous().to(DType::i32);
  // The positions whose log-softmax is needed: the replies' targets, and ORPO's NLL targets.
  targets_ = orpo ? Tensor::from_vector(nll_targets(tc, rows, seq), {rows, seq}) : tc;
  inputs_ = Tensor();
  std::vector<double> at(static_cast<size_t>(positions), 0.0);
  if (logits_.dtype() == DType::f64)
    position_logps(logits_.data<double>(), targets_.data<int32_t>(), positions, vocab,
                   lse_.data<double>(), at.data());
  else
    position_logps(logits_.data<float>(), targets_.data<int32_t>(), positions, vocab,
                   lse_.data<double>(), at.data());
  std::vector<int64_t> n;
  const std::vector<double> pi = row_sums(at.data(), tc.data<int32_t>(), rows, seq, &n);
  const PreferenceConfig& c = config_;
  if (needs_reference())
    FSDP_CHECK(int64_t(reference_.size()) == rows,
               "[preference] {}: {} reference log-probs for {} rows (prepare() or "
               "set_reference() before each forward)",
               preference_kind_name(c.kind), reference_.size(), rows);
  const double e = c.label_smoothing, beta = c.beta, k = a.scale / double(pairs);
  std::vector<double> coef(size_t(rows), 0.0);  // d(step loss) / d(row log-prob)
  double loss = 0;
  std::vector<double> m(metric_names().size(), 0.0);
  for (int64_t i = 0; i < pairs; ++i) {
    const size_t ch = size_t(2 * i), rj = ch + 1;
    const double nc = double(std::max<int64_t>(1, n[ch])), nr = double(std::max<int64_t>(1, n[rj]));
    double dl = 0, dc = 1, dr = 1;  // d(loss)/d(the pair's difference), d(difference)/d(row)
    double reward_c = 0, reward_r = 0, logp_c = pi[ch], logp_r = pi[rj];
    if (c.kind == PreferenceKind::simpo || orpo) {
      logp_c = pi[ch] / nc, logp_r = pi[rj] / nr;
      dc = 1 / nc, dr = 1 / nr;
      reward_c = beta * logp_c, reward_r = beta * logp_r;
    }
    if (c.kind == PreferenceKind::simpo) {
      const double z = logp_c - logp_r - c.simpo_gamma / beta;
      loss += -(1 - e) * log_sigmoid(beta * z) - e * log_sigmoid(-beta * z);
      dl = -(1 - e) * beta * sigmoid(-beta * z) + e * beta * sigmoid(beta * z);
    } else if (orpo) {
      // The log odds ratio of the averaged log-probs; an average of exactly 0 (probability 1,
      // infinite odds) is taken at the largest double below it, where TRL's would be infinite.
      const double pc = std::min(logp_c, -1e-300), pr = std::min(logp_r, -1e-300);
      const double odds = (pc - pr) - (log1mexp(pc) - log1mexp(pr));
      loss += -beta * log_sigmoid(odds);
      dl = -beta * sigmoid(-odds);
      dc /= -std::expm1(pc), dr /= -std::expm1(pr);  // d(odds)/d(pc) = 1 / (1 - e^pc)
      m[7] += log_sigmoid(odds), m[8] += odds;
    } else {
      const double lc = pi[ch] - reference_[ch], lr = pi[rj] - reference_[rj];
      reward_c = beta * lc, reward_r = beta * lr;
      if (c.kind == PreferenceKind::dpo) {
        const double d = lc - lr;
        loss += -(1 - e) * log_sigmoid(beta * d) - e * log_sigmoid(-beta * d);
        dl = -(1 - e) * beta * sigmoid(-beta * d) + e * beta * sigmoid(beta * d);
      } else {  // ipo: the log-ratios averaged over each reply's tokens
        const double d = lc / nc - lr / nr - 1 / (2 * beta);
        loss += d * d;
        dl = 2 * d;
        dc = 1 / nc, dr = 1 / nr;
      }
    }
    coef[ch] = k * dl * dc;
    coef[rj] = -k * dl * dr;
    m[0] += reward_c, m[1] += reward_r, m[2] += reward_c > reward_r ? 1.0 : 0.0;
    m[3] += reward_c - reward_r, m[4] += logp_c, m[5] += logp_r;
  }
  for (double& v : m) v /= double(pairs);
  loss /= double(pairs);
  // Each position's coefficient: its row's at the reply's targets, plus ORPO's NLL term (a mean
  // over the microbatch's chosen rows' NLL targets, TRL's per-device mean) on the chosen rows.
  const int32_t* reply = tc.data<int32_t>();
  const int32_t* all = targets_.data<int32_t>();
  coef_.assign(size_t(positions), 0.0);
  double nll = 0;
  int64_t nll_count = 0;
  for (int64_t p = 0; p < positions; ++p) {
    if (reply[p] != int32_t(kIgnoreIndex)) coef_[size_t(p)] = coef[size_t(p / seq)];
    if (orpo && (p / seq) % 2 == 0 && all[p] != int32_t(kIgnoreIndex)) {
      nll -= at[size_t(p)];
      ++nll_count;
    }
  }
  if (orpo && nll_count > 0) {
    for (int64_t p = 0; p < positions; ++p)
      if ((p / seq) % 2 == 0 && all[p] != int32_t(kIgnoreIndex))
        coef_[size_t(p)] -= a.scale / double(nll_count);
    nll /= double(nll_count);
    loss += nll;
    m[6] = nll;
  }
  reference_.clear();  // one forward's
  out.fill_(loss);
  metrics_ = Tensor::from_vector(m, {int64_t(m.size())});
  return out;
}

void PreferenceLoss::release() {
  logits_ = Tensor(), lse_ = Tensor(), targets_ = Tensor(), inputs_ = Tensor();
  coef_.clear();
  reference_.clear();
}

Tensor PreferenceLoss::backward() {
  FSDP_CHECK(logits_.defined(), "[preference] backward() without a forward");
  Tensor d = logits_;
  if (!d.device().is_meta()) {
    const int64_t positions = d.size(0), vocab = d.size(1);
    if (d.dtype() == DType::f64)
      dlogits_of(d.data<double>(), targets_.data<int32_t>(), positions, vocab, lse_.data<double>(),
                 coef_);
    else
      dlogits_of(d.data<float>(), targets_.data<int32_t>(), positions, vocab, lse_.data<double>(),
                 coef_);
  }
  logits_ = Tensor(), lse_ = Tensor(), targets_ = Tensor();
  return (d.dtype() == out_dtype_ ? d : d.to(out_dtype_)).view(out_shape_);
}

std::string PreferenceLoss::describe() const {
  const PreferenceConfig& c = config_;
  std::string what = fmt::format("{} beta {}", preference_kind_name(c.kind), c.beta);
  if (c.label_smoothing > 0) what += fmt::format(" label smoothing {}", c.label_smoothing);
  if (c.kind == PreferenceKind::simpo) what += fmt::format(" gamma {}", c.simpo_gamma);
  if (needs_reference())
    what += precomputed_               ? ", reference: precomputed log-probs"
            : reference_model_           ? ", reference: a frozen sharded model"
            : c.reference_adapters_off ? ", reference: the base (adapters off)"
                                       : ", reference given";
  return what + ", log-probs from the logits";
}

}  // namespace fsdp::train
