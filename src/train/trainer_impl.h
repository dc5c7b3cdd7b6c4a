// Trainer::Impl (fsdp/train/trainer.h): the state of one run, and its parts by file:
// trainer_setup.cpp (mesh, tokenizer, data, model), trainer_parts.cpp (loss, optimizer, schedule),
// trainer_resources.cpp (the memory plan's
// check, the FLOP/s ceiling), trainer_resume.cpp, trainer.cpp (the loop), trainer_report.cpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/manager.h"
#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/models/spec.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/optim/optimizer.h"
#include "fsdp/train/loss.h"
#include "fsdp/profiler/ceilings.h"
#include "fsdp/profiler/metrics.h"
#include "fsdp/profiler/tensorboard.h"
#include "fsdp/train/memory_plan.h"
#include "fsdp/train/trainer.h"

namespace fsdp::train {

class PreferenceLoss;

struct Trainer::Impl {
  TrainOptions o;
  std::shared_ptr<const checkpoint::Pretrained> pretrained;  // --init-from
  nn::TransformerConfig cfg;
  const models::ModelSpec* family;  // how the model is built and parallelized (models/spec.h)
  DType dtype;
  // LoRA on a bf16 or f16 --dtype: the frozen base's dtype (the adapters' masters are f32).
  std::optional<DType> frozen_dtype;
  // --base-quant keep: the base's weights kept as the GGUF's blocks (fully_shard's frozen_packed).
  std::function<std::optional<PackedRows>(const std::string&)> frozen_packed;
  std::shared_ptr<dist::ProcessGroup> pg;
  std::shared_ptr<dist::DeviceMesh> mesh;
  // --expert-parallel N > 1: dist::init_expert_mesh(N), whose "ep" groups split the experts and
  // whose "dp_shard_mod_ep" groups shard them; null otherwise.
  std::shared_ptr<dist::DeviceMesh> expert_mesh;
  int rank = 0, size = 1, threads = 1;
  Device device;
  MixedPrecisionPolicy mp;
  std::shared_ptr<data::TokenSource> src, val;
  std::optional<data::Tokenizer> tokenizer;
  bool model_tokenizer = false;  // the tokenizer came with the --init-from model
  std::unique_ptr<nn::Transformer> model;
  std::unique_ptr<nn::Transformer> reference;  // a full fine-tune's preference reference, frozen
  std::vector<nn::ParamGroup> groups;
  DataParallelModule* parallel = nullptr;  // the step's one interface: root, or replicate's
  FSDPModule* root = nullptr;              // --shard full: the sharded root, for checkpoints
  TrainerParts parts;  // what the caller handed in; the empty ones are filled in by setup
  bool given_optimizer = false;  // parts.optimizer was the caller's
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<data::DataLoader> loader;
  double peak = 0;           // FLOP/s, all ranks: the MFU denominator
  double peak_measured = 0;  // the peak before a step's rate raised it
  double peak_units = 1;     // what the peak is the sum over: machines (CPU) or GPUs
  MemoryPlan plan;  // this rank's predicted peak memory, from the shapes (check_memory_plan)
  std::string config_json;
  int64_t start_step = 0, steps_done = 0;
  std::ofstream log;
  std::unique_ptr<profiler::EventWriter> tensorboard;  // rank 0, with --tensorboard
  // The run as the summary reports it: from fit()'s start, the steps' times for the ETA (the
  // last kEtaWindow), and the best validation loss.
  std::chrono::steady_clock::time_point fit_start;
  std::deque<double> recent_steps;
  static constexpr size_t kEtaWindow = 20;
  std::optional<double> best_val_loss;
  // Communication: seconds in collectives on their threads, and seconds the
  // compute thread waited for them (exposed), summed over the timed steps.
  double comm_total = 0, exposed_total = 0, step_total = 0, gather_total = 0;
  int64_t steps_timed = 0;  // the steps those sums cover (a resume or a stop times fewer)
  double longest_step = 0;  // seconds
  // --ckpt-dir: the folder's owner (lock, one run per folder, resume, sync or background saves)
  std::unique_ptr<checkpoint::Manager> ckpt;

  bool main() const { return rank == 0; }

  static int peak_threads() { return int(std::max(1u, std::thread::hardware_concurrency())); }

  // Setup (trainer_setup.cpp): the mesh, the tokenizer, the data, the model.
  Impl(const TrainOptions& options, std::shared_ptr<dist::ProcessGroup> group, TrainerParts given);
  void open_data();
  std::unique_ptr<data::TokenStream> open_stream(const std::string& spec);
  std::unique_ptr<data::SampleSource> open_samples(const std::string& spec);
  int32_t pack_eos() const;
  void open_tokenizer();
  void build_model();
  // The reference model of pref (null: none): --pref-reference's, or a copy of the initial model.
  void build_reference(PreferenceLoss* pref);
  // --pref-precompute-ref (trainer_reference.cpp): every pair's reference log-probs (training's and
  // validation's), read from the run's cache file or computed in one pass, sharded as training
  // is, and handed to the sources; the loss then runs no reference model.
  void precompute_reference();
  // The preference loss whose reference is a model of its own (a full fine-tune's frozen copy,
  // --pref-reference), or null: no second model is built.
  PreferenceLoss* separate_reference_loss();
  // The parts not handed in (TrainerParts), built from the options (trainer_parts.cpp).
  void fill_parts();

  // Resources (trainer_resources.cpp): the memory plan's check, the FLOP/s ceiling.
  void check_memory_plan();
  void measure_peak();
  void raise_peak(profiler::StepMetrics& m);

  // --resume (trainer_resume.cpp).
  void resume();
  // What a checkpoint of the run holds: root, optimizer, config (the family's shape keys, dtype
  // and a LoRA run's base are a resume's model keys) and the loader's position as part "data"
  // (optional: checkpoints from before it saved the loader's batch index).
  checkpoint::RunState run_state();

  // The loop (trainer.cpp).
  void account(profiler::StepMetrics& m);
  double evaluate();
  double eval_loss(const data::Batch& b, double divisor);
  // A preference loss's validation: the loss and its metrics over the validation pairs.
  double evaluate_pairs(PreferenceLoss& pref);
  std::vector<std::pair<std::string, double>> eval_named;  // the last one's metrics, "eval_" names
  // Each MoE layer's experts' load in the latest training forward (its last microbatch's) over
  // the global batch: the most and the fewest (token, choice) pairs an expert got, as
  // "load_max/<layer>" and "load_min/<layer>". Collective (one all-reduce); none for a dense model.
  std::vector<std::pair<std::string, double>> expert_load();
  void save(int64_t step);
  void write_tensorboard(const profiler::StepMetrics& m);
  void finish_async_save();
  void fit();

  // What rank 0 prints (trainer_report.cpp).
  void print_config(int64_t persistent, int64_t persistent_measured) const;
  void print_summary();
  void print_sample();
};

}  // namespace fsdp::train
