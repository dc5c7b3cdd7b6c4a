// Preference losses on pairs of rows (data/preference.h: row 2i the chosen reply, row 2i + 1 the
// rejected one, targets on the replies' tokens only), as a train::Loss, with TRL 1.16's formulas:
//   dpo    DPOTrainer's "sigmoid": -log sigmoid(beta d), d = (pi_c - ref_c) - (pi_r - ref_r), the
//          log-probs summed over each reply's tokens. label_smoothing e > 0 gives the conservative
//          form -(1 - e) log sigmoid(beta d) - e log sigmoid(-beta d) (cDPO; TRL 1.16's sigmoid
//          has no smoothing, its "robust" and CPO's "sigmoid" take this e).
//   ipo    DPOTrainer's "ipo": (d' - 1 / (2 beta))^2, d' the same log-ratios each divided by its
//          reply's token count.
//   simpo  CPOTrainer's "simpo" with cpo_alpha 0 (the SimPO paper's loss; CPO's default adds an NLL
//          term): -(1 - e) log sigmoid(beta z) - e log sigmoid(-beta z), z = pi_c / n_c -
//          pi_r / n_r - gamma / beta. No reference.
//   orpo   ORPOTrainer's: the chosen rows' NLL minus beta log sigmoid(r), r the log odds ratio
//          log(p_c / (1 - p_c)) - log(p_r / (1 - p_r)) of the averaged log-probs log p = pi / n.
//          The NLL, as TRL's, covers each chosen row's whole sequence (its prompt too, from the
//          inputs prepare() records) and is a mean over the microbatch's chosen tokens (TRL's per
//          device): unlike the other terms, its weighting depends on how the pairs fall into
//          microbatches and ranks. No reference.
// Metrics with TRL's names (rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
// logps/chosen, logps/rejected): DPOTrainer's (rewards beta (pi - ref) of the summed log-probs) for
// dpo and ipo, CPOTrainer's (rewards beta pi / n, logps pi / n) for simpo and orpo, and ORPO's
// nll_loss, log_odds_ratio (the mean log sigmoid(r)) and log_odds_chosen (the mean r).
//
// The step's loss is the mean over every pair of the step (all ranks, all microbatches): a
// microbatch's value is its pairs' sum / its pair count, which, with the step's mean over
// microbatches and ranks, is the mean over the step's pairs whatever the world size (the target
// counts, LossArgs::divisor, play no part). The log-probs are computed on the host from the
// logits [B, T, V] (CPU runs; the fused head gives no per-row values), and dlogits overwrite the
// logits as LMLoss's do. Its own buffer: each position's log-sum-exp, [B x T] f64.
//
// The reference (dpo, ipo): prepare() runs the model on the microbatch with its LoRA adapters off
// (nn::LoraDisabledScope: the sharded base, no second copy), no backward, before the policy's
// forward; or another model given by set_reference_model() (a full fine-tune's frozen sharded copy
// of the initial model); or set_reference() gives the rows' reference log-probs; or, with
// set_precomputed(true), each batch carries its rows' (data::Batch::reference_logps: computed in a
// pass over the pairs before training, TRL's precompute_ref_log_probs) and no reference model runs.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/nn/module.h"
#include "fsdp/train/loss.h"

namespace fsdp::train {

enum class PreferenceKind { dpo, ipo, simpo, orpo };
PreferenceKind parse_preference_kind(const std::string& name);  // throws naming the choices
const char* preference_kind_name(PreferenceKind kind);

struct PreferenceConfig {
  PreferenceKind kind = PreferenceKind::dpo;
  double beta = 0.1;             // TRL's beta (DPOConfig, CPOConfig)
  double label_smoothing = 0.0;  // dpo and simpo: in [0, 0.5)
  double simpo_gamma = 0.5;      // CPOConfig's simpo_gamma
  // dpo, ipo: prepare() computes the reference by the model with its adapters off. false: the
  // caller gives it (set_reference) before each forward.
  bool reference_adapters_off = true;
};

// Per-row sums of log-softmax at the targets (kIgnoreIndex: not counted) of logits [B, T, V] or
// [B x T, V] (f32 or f64, on the host), and each row's count of targets.
std::vector<double> row_target_logps(const Tensor& logits, const Tensor& targets,
                                     std::vector<int64_t>* counts = nullptr);

// Each row's reference log-prob: `model`'s forward on the batch with no backward (no records
// kept; under an nn::LoraDisabledScope for the base with its adapters off), the row sums of
// row_target_logps; reshard: the model's root is resharded after it (a model of its own). On the
// meta device (the memory plan), zeros.
std::vector<double> reference_row_logps(nn::Module& model, const data::Batch& batch, bool reshard);

class PreferenceLoss final : public Loss {
 public:
  explicit PreferenceLoss(PreferenceConfig config);
  void prepare(nn::Module& model, const data::Batch& batch) override;
  Tensor forward(const Tensor& output, const Tensor& targets, const LossArgs& a) override;
  Tensor backward() override;
  std::string describe() const override;
  // A model to run as the reference in prepare() in place of the policy with its adapters off (a
  // full fine-tune's frozen copy of the initial model; null: the policy, adapters off).
  void set_reference_model(nn::Module* model) { reference_model_ = model; }
  // Drops what the last forward kept for its backward (an evaluation: no backward comes).
  void release();
  // Whether prepare() takes the reference log-probs from the batch (Batch::reference_logps).
  void set_precomputed(bool on) { precomputed_ = on; }
  bool precomputed() const { return precomputed_; }
  // The next forward's rows' reference log-probs (one per row).
  void set_reference(std::vector<double> logps) { reference_ = std::move(logps); }
  bool needs_reference() const {
    return config_.kind == PreferenceKind::dpo || config_.kind == PreferenceKind::ipo;
  }
  // orpo: the next forward's inputs [B, T] (prepare() records the batch's), whose tokens are the
  // chosen rows' NLL targets.
  void set_inputs(const Tensor& inputs);
  // TRL's metric names, and the last forward's values (f64 [6], orpo's [9], on the output's
  // device), each the microbatch's pairs' sum / its pair count (orpo's nll_loss: the microbatch's
  // NLL): the step's mean over them is the mean over pairs.
  std::vector<std::string> metric_names() const override;
  Tensor metrics() const override { return metrics_; }

 private:
  PreferenceConfig config_;
  std::vector<double> reference_;
  nn::Module* reference_model_ = nullptr;
  bool checked_adapters_ = false;  // prepare() found LoRA adapters to switch off
  bool precomputed_ = false;       // set_precomputed
  std::vector<int32_t> nll_targets(const Tensor& targets, int64_t rows, int64_t seq) const;

  std::vector<double> coef_;  // d(step loss) / d(each position's log-prob at its target)
  Tensor logits_, lse_, metrics_;
  Tensor targets_;  // the positions' targets: the replies', and orpo's NLL targets
  Tensor inputs_;   // orpo: the microbatch's inputs (set_inputs)
  DType out_dtype_ = DType::f32;
  Shape out_shape_;
};

}  // namespace fsdp::train
