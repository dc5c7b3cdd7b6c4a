// fsdp-train: trains the MiniLLM. The C++ form of the reference PyTorch
// script (train_fsdp.py; see README.md): the same model, the same defaults
// (AdamW lr 3e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, random
// tokens, batch 8 x 1024) and the same per-step line, plus tokens/s and MFU:
//   step 3 | loss 7.1234 | 1234 tok/s | mfu 41.2% | peak mem 0.52 GB
// With --data FILE it trains on the file's bytes and prints a sample at the end.
//
// Launched with mpirun, scripts/fsdprun or torchrun, it trains sharded with
// fully_shard on every block and on the root (FSDP2's recipe). The loop is
// the library's train::Trainer (fsdp/train/trainer.h); this file is its
// command line. It is the only place that catches fsdp::Error: it prints the
// message and exits non-zero.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/env.h"
#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/dist/init.h"
#include "fsdp/dist/process_group.h"
#include "fsdp/train/trainer.h"

namespace {

// Every rank must run the same command line: each argument's hash (and their count) is
// all-gathered once and a difference is named by its place and this rank's value (a different
// --lr or --data used to train on silently).
void check_same_arguments(fsdp::dist::ProcessGroup& pg, int argc, char** argv) {
  if (pg.size() == 1) return;
  constexpr int kSlots = 64;  // arguments past the last slot are folded into it
  auto fnv = [](std::string_view s, uint32_t h) {
    for (unsigned char c : s) h = (h ^ c) * 16777619u;
    return h;
  };
  fsdp::Tensor mine = fsdp::Tensor::zeros({kSlots + 1}, fsdp::DType::f64);
  double* m = mine.data<double>();
  m[0] = double(argc - 1);
  for (int i = 1; i < argc; ++i) {
    double& slot = m[std::min(i, kSlots)];
    slot = double(fnv(argv[i], i < kSlots ? 2166136261u : uint32_t(slot)));
  }
  fsdp::Tensor all = fsdp::Tensor::empty({(kSlots + 1) * pg.size()}, fsdp::DType::f64, pg.device());
  pg.all_gather_into_tensor(all, mine.to(pg.device()))->wait();
  const std::vector<double> v = all.to_f64_vector();
  for (int r = 0; r < pg.size(); ++r)
    for (int i = 0; i <= kSlots; ++i)
      if (v[size_t(r * (kSlots + 1) + i)] != v[size_t(i)]) {
        const std::string here =
            i == 0 ? fmt::format("{} arguments", argc - 1)
                   : i < argc ? fmt::format("'{}'", argv[i]) : std::string("nothing");
        FSDP_FAIL(
            "[fsdp-train] the ranks were started with different arguments: rank {} differs from "
            "rank 0 {} (this rank, {}, has {} there); every rank must run the same command line",
            r, i == 0 ? "in the number of arguments" : fmt::format("at argument {}", i),
            pg.rank(), here);
      }
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::train::TrainOptions o;
  std::string device_name = "cpu", backend;  // empty backend: from the device and the launcher
  CLI::App app{"fsdp-train: train the MiniLLM (the C++ form of the reference FSDP2 script)",
               "fsdp-train"};
  app.get_formatter()->column_width(34);
  app.option_defaults()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides an earlier one
  app.add_option("--preset", o.preset, "model and batch preset: seed (the reference size) or tiny")
      ->capture_default_str();
  app.add_option("--arch", o.arch,
                 "architecture: seed (reference MiniLLM) or llama (causal, RoPE, SwiGLU)");
  app.add_option("--vocab", o.vocab, "vocabulary size (overrides the preset)");
  app.add_option("--dim", o.dim, "model width (overrides the preset)");
  app.add_option("--layers", o.layers, "transformer blocks (overrides the preset)");
  app.add_option("--heads", o.heads, "attention heads (overrides the preset)");
  app.add_option("--seq", o.seq, "sequence length (overrides the preset)");
  app.add_option("--batch", o.batch, "sequences per step (overrides the preset)");
  app.add_option("--ffn-hidden", o.ffn_hidden,
                 "FFN hidden size (0: 4*dim for seed, 8/3*dim rounded for llama)");
  app.add_option("--kv-heads", o.kv_heads,
                 "llama: key/value heads (0 or --heads: multi-head; 1: multi-query; a divisor "
                 "of --heads: grouped-query)");
  app.add_option("--head-dim", o.head_dim, "llama: per-head dim (0: dim / heads)");
  app.add_option("--rope-theta", o.rope_theta, "llama: rotary embedding base (default 10000)");
  app.add_flag("--tie-embeddings", o.tie_embeddings,
               "llama: the head computes with the embedding's weight (one parameter)");
  app.add_flag("--qkv-bias", o.qkv_bias, "llama: biases on q, k and v (Qwen2)");
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay")
      ->capture_default_str();
  app.add_option("--beta1", o.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", o.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--eps", o.eps, "AdamW eps")->capture_default_str();
  app.add_option("--seed", o.seed, "seed for initialisation and random tokens")
      ->capture_default_str();
  app.add_option("--dtype", o.dtype, "dtype of the (master) parameters: f32 or f64 (f32 on CUDA)")
      ->capture_default_str();
  app.add_option("--device", device_name,
                 "cpu or cuda (ranks take the GPU of their local rank; NCCL)")
      ->capture_default_str();
  app.add_option(
         "--backend", backend,
         "the engine of the collectives: nccl (CUDA; default there, with MPI or Gloo for "
         "host values), or mpi / gloo (the launcher's; with --device cuda, CUDA tensors are "
         "staged through the host, so several ranks can share one GPU)")
      ->check(CLI::IsMember({"nccl", "mpi", "gloo", "local"}));
  app.add_option("--threads", o.threads, "OpenMP threads for BLAS and kernels (0: all cores)")
      ->capture_default_str();
  app.add_option("--data", o.data,
                 "llm.c .bin token shards (a file, a directory or a glob) or a text file read as "
                 "bytes (vocab >= 256); "
                 "default: random tokens");
  app.add_option("--tokenizer", o.tokenizer,
                 "auto (the tokenizer.json beside .bin shards, else bytes), a tokenizer.json, or "
                 "bytes; saved in every checkpoint")
      ->capture_default_str();
  app.add_option("--sample-tokens", o.sample_tokens, "tokens to sample after training on --data")
      ->capture_default_str();
  app.add_option("--prompt", o.prompt, "prompt for the sample")->capture_default_str();
  app.add_option("--temperature", o.temperature, "sampling temperature")->capture_default_str();
  app.add_option("--shard", o.shard,
                 "full: fully_shard every block and the root; none: DDP-style baseline")
      ->capture_default_str();
  app.add_option("--reshard-after-forward", o.reshard_after_forward,
                 "free each block's unsharded parameters after its forward (false: ZeRO-2 style)")
      ->capture_default_str();
  app.add_option("--activation-checkpoint", o.activation_checkpoint,
                 "none, full (each block keeps only its input; its backward recomputes the "
                 "forward) or every:N (blocks 0, N, 2N, ...)")
      ->capture_default_str();
  app.add_option("--hsdp", o.hsdp,
                 "HSDP: this many replica groups, each sharding over world/R ranks (0: off)")
      ->capture_default_str();
  app.add_option("--grad-accum", o.grad_accum,
                 "microbatches per optimizer step (gradients reduced on the last)")
      ->capture_default_str();
  app.add_option("--param-dtype", o.param_dtype,
                 "fully_shard's param_dtype: all-gather and compute dtype (e.g. bf16)");
  app.add_option("--reduce-dtype", o.reduce_dtype,
                 "fully_shard's reduce_dtype: gradient reduce-scatter dtype");
  app.add_option("--grad-clip,--clip", o.clip, "clip gradients to this global norm (0: off)")
      ->capture_default_str();
  app.add_option("--warmup-steps", o.warmup, "linear learning-rate warmup steps")
      ->capture_default_str();
  app.add_option("--lr-decay", o.lr_decay, "after warmup: none (constant), cosine or linear")
      ->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the decay")
      ->capture_default_str();
  app.add_option("--decay-steps", o.decay_steps,
                 "step at which the decay reaches --min-lr (0: --steps)")
      ->capture_default_str();
  app.add_flag("--wd-2d-only", o.wd_2d_only,
               "apply weight decay to 2-D weights only (not norms and biases)");
  app.add_option("--eval-every", o.eval_every, "print the validation loss every N steps (0: never)")
      ->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches, "batches per validation")->capture_default_str();
  app.add_flag("--shuffle", o.shuffle,
               "visit the data's seq+1-token windows in a seeded random order each epoch");
  app.add_option("--val-data", o.val_data,
                 "validation data (default: the last --val-fraction of --data)");
  app.add_option("--val-fraction", o.val_fraction, "share of --data held out for validation")
      ->capture_default_str();
  app.add_option("--ckpt-dir", o.ckpt_dir, "directory of sharded checkpoints");
  app.add_option("--ckpt-every", o.ckpt_every,
                 "save a checkpoint every N steps and at the end (0: never)")
      ->capture_default_str();
  app.add_option("--keep", o.keep, "keep the newest K checkpoints (0: all)")->capture_default_str();
  app.add_flag("--async-checkpoint", o.async_checkpoint,
               "copy each checkpoint to host memory at the step boundary and write it on a "
               "background thread while training goes on");
  app.add_flag("--resume", o.resume, "continue from the newest checkpoint in --ckpt-dir");
  app.add_flag("--overwrite", o.overwrite,
               "a fresh run into a --ckpt-dir that holds checkpoints: remove them first (its "
               "step_* and .tmp_step_* folders); without it such a run is refused");
  app.add_option("--init-from", o.init_from,
                 "start from a pretrained model: a Hugging Face folder or a .gguf file (its "
                 "architecture and tokenizer), or full weights in a safetensors file");
  app.add_option("--log-file", o.log_file, "append one JSON object per step to this file");
  app.add_flag("--allow-oversubscribe-memory", o.allow_oversubscribe_memory,
               "start even when parameters, gradients and AdamW state need more memory than "
               "this host (its cgroup, or MemAvailable) has left");
  app.add_option("--profile-steps", o.profile_steps,
                 "profile steps A:B (A included, B not), e.g. 3:5");
  app.add_option("--profile-dir", o.profile_dir, "where the trace and table of each rank go")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    fmt::print(stderr, "fsdp-train: error: {}\nRun with --help for the flags.\n", e.what());
    return 2;
  }
  try {
    fsdp::validate_env();  // every FSDP_* knob, by name, before anything reads one
    const fsdp::Device device = fsdp::parse_device(device_name);
    FSDP_CHECK(
        device.is_cpu() || fsdp::cuda_available(),
        "[fsdp-train] --device {}: no CUDA device is visible (or fsdp.cpp was built without CUDA)",
        device_name);
    fsdp::train::install_stop_handlers();  // SIGTERM/SIGINT: checkpoint after this step, exit 0
    {
      auto pg = fsdp::dist::init_process_group({.device = device, .backend = backend});
      check_same_arguments(*pg, argc, argv);
      fsdp::train::Trainer trainer(o, pg);
      trainer.fit();
    }
    fsdp::dist::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    // Peers may be waiting in a collective this rank will never join: end the
    // job instead of unwinding into destructors that wait for them.
    const int rank = fsdp::dist::is_initialized() ? fsdp::dist::world_info().rank : 0;
    fmt::print(stderr, "fsdp-train: error{}: {}\n", rank ? fmt::format(" (rank {})", rank) : "",
               e.what());
    fsdp::dist::abort_process(1);
  }
}
