// The MiniLLM training loop as a library piece, in the shape of torchtitan's
// Trainer: options in, a sharded run out. fsdp-train is its command line.
//
//   train::TrainOptions o;            // defaults: the reference script's
//   o.steps = 100; o.ckpt_dir = "ckpt"; o.ckpt_every = 50; o.resume = true;
//   auto pg = dist::init_process_group({.device = Device::cpu()});
//   train::Trainer trainer(o, pg);    // mesh, data, model, fully_shard, AdamW, resume
//   trainer.fit();                    // the steps, eval, checkpoints, profile, summary
//
// Each rank reads its own rows of a global batch of world_size x batch rows,
// so the data a step sees does not depend on the world size. shard = "none"
// is a DDP-style baseline (replicated parameters, all-reduced gradients).
// A bad option throws fsdp::Error naming the flag and the value.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "fsdp/dist/process_group.h"
#include "fsdp/nn/minillm.h"

namespace fsdp::train {

// Every field is a flag of fsdp-train (steps is --steps, lr_decay is --lr-decay).
struct TrainOptions {
  // model: a preset and its overrides
  std::string preset = "tiny";
  std::optional<std::string> arch;
  std::optional<int64_t> vocab, dim, layers, heads, seq, batch, ffn_hidden;
  // llama's options (nn::MiniLLMConfig): --kv-heads, --head-dim, --rope-theta, --tie-embeddings,
  // --qkv-bias
  std::optional<int64_t> kv_heads, head_dim;
  std::optional<double> rope_theta;
  bool tie_embeddings = false, qkv_bias = false;
  // optimizer
  int64_t steps = 5;
  double lr = 3e-4, weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  bool wd_2d_only = false;
  double clip = 0.0;  // global gradient norm; 0: off
  int64_t warmup = 0;
  std::string lr_decay = "none";  // none, cosine or linear
  double min_lr = 0.0;
  int64_t decay_steps = 0;  // 0: steps
  uint64_t seed = 1337;
  std::string dtype = "f32";  // the (master) parameters
  int threads = 0;            // 0: this rank's share of the cores
  // sharding
  std::string shard = "full";  // full or none
  bool reshard_after_forward = true;
  // none, full (every block keeps only its input and recomputes the rest in the backward) or
  // every:N (blocks 0, N, 2N, ...: torchtitan's selective layer checkpointing)
  std::string activation_checkpoint = "none";
  int64_t hsdp = 0;  // replica groups; 0: off
  int64_t grad_accum = 1;
  std::string param_dtype, reduce_dtype;
  // data
  std::string data;  // empty: random tokens
  // auto: the tokenizer.json beside .bin shards, else bytes; or a tokenizer.json; or bytes.
  // Saved in every checkpoint (tokenizer.json), where fsdp-export and fsdp-generate find it.
  std::string tokenizer = "auto";
  bool shuffle = false;
  std::string val_data;
  double val_fraction = 0.1;
  int64_t eval_every = 0, eval_batches = 4;
  // sample after training on data
  int64_t sample_tokens = 200;
  std::string prompt = "The ";
  double temperature = 0.8;
  // checkpoints, logging, profiling
  std::string ckpt_dir;
  int64_t ckpt_every = 0;
  int keep = 0;
  // Checkpoints are copied to host buffers at the step boundary and written by a background
  // thread while training goes on (checkpoint::AsyncSaver); same files, same protocol.
  bool async_checkpoint = false;
  bool resume = false;
  // A fresh run (no resume) into a ckpt_dir holding checkpoints is refused; overwrite clears its
  // step_* and .tmp_step_* folders first (checkpoint::Manager: one run per folder).
  bool overwrite = false;
  std::string init_from;
  std::string log_file;
  bool allow_oversubscribe_memory = false;  // skip the memory plan's check at start
  std::string profile_steps;  // "A:B": steps A (included) to B (not)
  std::string profile_dir = "profile";

  // The preset with its overrides applied, validated.
  nn::MiniLLMConfig model_config() const;
  // Throws, naming the flag and the value, on any option out of range or inconsistent with
  // another (the model's own checks are model_config's).
  void validate() const;
};

// Preemption, as clusters do it: after install_stop_handlers(), the first SIGTERM or SIGINT
// asks every Trainer::fit() to stop after its current step (the ranks agree on it, a checkpoint
// is written when ckpt_dir is set, and fit() returns normally, so the process can exit 0); a
// second one ends the process at once (status 128 + the signal).
void install_stop_handlers();
// The N of --activation-checkpoint: 0 for none, 1 for full, N for every:N; else an error.
int64_t checkpoint_every_blocks(const std::string& mode);
int stop_signal();  // the signal that asked to stop; 0 when none has

class Trainer {
 public:
  // Collective: every rank of `pg` constructs its Trainer. Builds the mesh, the data, the model
  // (fully_shard per block and on the root), AdamW and the schedule; prints the run's table on
  // rank 0; with resume, loads the newest checkpoint of ckpt_dir.
  Trainer(const TrainOptions& options, std::shared_ptr<dist::ProcessGroup> pg);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs steps start_step() .. steps-1: a step line on rank 0 per step, validation, the JSONL
  // log, checkpoints, the profile window, then the summary line and (after training on data)
  // a sample. Collective.
  void fit();
  int64_t start_step() const;
  int64_t steps_done() const;  // the step fit() stopped after (steps, or earlier on a signal)
  nn::MiniLLM& model();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::train
