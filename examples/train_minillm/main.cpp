// fsdp-train: trains the MiniLLM. The C++ form of the reference PyTorch
// script (../shared/seed/train_fsdp.py): the same model, the same defaults
// (AdamW lr 3e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, random
// tokens, batch 8 x 1024) and the same per-step line, plus tokens/s and MFU:
//   step 3 | loss 7.1234 | 1234 tok/s | mfu 41.2% | peak mem 0.52 GB
// With --data FILE it trains on the file's bytes and prints a sample at the end.
//
// Launched with mpirun, scripts/fsdprun or torchrun, it trains sharded with
// fully_shard on every block and on the root (FSDP2's recipe); each rank
// reads its own rows of a global batch of world_size x --batch rows, so the
// data a step sees does not depend on the world size. --shard none is a
// DDP-style baseline (replicated parameters, all-reduced gradients).
// This binary is the only place that catches fsdp::Error: it prints the
// message and exits non-zero.
#include <omp.h>
#include <sched.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/core/allocator.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/text_dataset.h"
#include "fsdp/dist/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/init.h"
#include "fsdp/nn/loss.h"
#include "fsdp/nn/minillm.h"
#include "fsdp/nn/sample.h"
#include "fsdp/ops/ops.h"
#include "fsdp/ops/peak.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/clip.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/profiler/metrics.h"
#include "fsdp/profiler/profiler.h"

namespace {

using namespace fsdp;

struct Options {
  std::string preset = "tiny";
  std::optional<std::string> arch;
  std::optional<int64_t> vocab, dim, layers, heads, seq, batch, ffn_hidden;
  int64_t steps = 5;
  double lr = 3e-4, weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  uint64_t seed = 1337;
  std::string dtype = "f32";
  std::string device = "cpu";
  std::string backend;  // empty: from the device and the launcher
  int threads = 0;
  std::string data;
  int64_t sample_tokens = 200;
  std::string prompt = "The ";
  double temperature = 0.8;
  // distributed
  std::string shard = "full";
  bool reshard_after_forward = true;
  int64_t hsdp = 0;
  int64_t grad_accum = 1;
  std::string param_dtype, reduce_dtype;
  double clip = 0.0;
  // schedule, data, checkpoints, logging
  int64_t warmup = 0;
  std::string lr_decay = "none";
  double min_lr = 0.0;
  int64_t decay_steps = 0;
  bool wd_2d_only = false;
  int64_t eval_every = 0, eval_batches = 4;
  std::string val_data;
  double val_fraction = 0.1;
  std::string ckpt_dir;
  int64_t ckpt_every = 0;
  int keep = 0;
  bool resume = false;
  std::string init_from;
  std::string log_file;
  std::string profile_steps, profile_dir = "profile";
  bool shuffle = false;
};

struct World {
  std::shared_ptr<dist::ProcessGroup> pg;
  std::shared_ptr<dist::DeviceMesh> mesh;
  int rank = 0, size = 1;
  bool main() const { return rank == 0; }
};

void print_config(const nn::MiniLLMConfig& c, const Options& o, int64_t nparams, DType dtype,
                  int threads, const data::TokenSource& src, double peak, const World& w,
                  const std::string& dtypes, int64_t persistent_bytes,
                  int64_t persistent_measured) {
  auto row = [](const std::string& k, const std::string& v) {
    fmt::print("| {:<22} | {:<44} |\n", k, v);
  };
  fmt::print("+{:-<24}+{:-<46}+\n", "", "");
  row("preset / arch", fmt::format("{} / {}", o.preset, nn::arch_name(c.arch)));
  row("vocab / dim / layers", fmt::format("{} / {} / {}", c.vocab, c.dim, c.layers));
  row("heads / ffn hidden", fmt::format("{} / {}", c.heads, c.resolved_ffn_hidden()));
  row("seq x batch", fmt::format("{} x {} x {} ranks x {} accum = {} tokens/step", c.seq, c.batch,
                                 w.size, o.grad_accum, c.seq * c.batch * w.size * o.grad_accum));
  row("parameters", fmt::format("{} ({:.2f} M)", nparams, double(nparams) / 1e6));
  row("dtype", std::string(dtype_name(dtype)) + dtypes);
  row("optimizer", fmt::format("AdamW lr {:g} betas ({:g}, {:g}) wd {:g}", o.lr, o.beta1, o.beta2,
                               o.weight_decay));
  row("steps / seed", fmt::format("{} / {}", o.steps, o.seed));
  row("data", src.describe());
  row("world size",
      fmt::format("{} ({}, {})", w.size, w.pg->backend(), dist::world_info().launcher));
  row("sharding", o.shard == "none"
                      ? std::string("none (DDP-style baseline)")
                      : fmt::format("fully_shard on {}{}", w.mesh->str(),
                                    o.reshard_after_forward ? "" : ", no reshard after forward"));
  row("persistent mem / rank",
      fmt::format("{:.3f} MB formula, {:.3f} MB measured", double(persistent_bytes) / 1e6,
                  double(persistent_measured) / 1e6));
  row("threads", std::to_string(threads));
  row("sgemm peak", fmt::format("{:.1f} GFLOP/s, all ranks (MFU denominator)", peak / 1e9));
  row("FLOPs / token", fmt::format("{:.3g}", c.flops_per_token()));
  fmt::print("+{:-<24}+{:-<46}+\n", "", "");
}

// Bytes per rank of parameters, gradients and AdamW state when each
// parameter is chunked on dim 0 over `shards` ranks and padded to the largest chunk.
int64_t persistent_bytes(nn::MiniLLM& model, int64_t shards, DType dtype) {
  int64_t elems = 0;
  for (auto& [name, p] : model.named_parameters()) {
    const int64_t rows = p->shape[0], row = shape_numel(p->shape) / std::max<int64_t>(rows, 1);
    elems += dist::chunk_size(rows, shards) * row;
  }
  return 4 * elems * int64_t(dtype_size(dtype));
}

int run(const Options& o, World& w) {
  nn::MiniLLMConfig cfg = nn::MiniLLMConfig::preset(o.preset);
  if (o.arch) cfg.arch = nn::parse_arch(*o.arch);
  if (o.vocab) cfg.vocab = *o.vocab;
  if (o.dim) cfg.dim = *o.dim;
  if (o.layers) cfg.layers = *o.layers;
  if (o.heads) cfg.heads = *o.heads;
  if (o.seq) cfg.seq = *o.seq;
  if (o.batch) cfg.batch = *o.batch;
  if (o.ffn_hidden) cfg.ffn_hidden = *o.ffn_hidden;
  cfg.validate();
  FSDP_CHECK(o.steps >= 0, "[fsdp-train] --steps must be >= 0, got {}", o.steps);
  FSDP_CHECK(o.lr >= 0 && std::isfinite(o.lr),
             "[fsdp-train] --lr must be a finite number >= 0, got {}", o.lr);
  FSDP_CHECK(o.threads >= 0,
             "[fsdp-train] --threads must be >= 0 (0 = this rank's share of the cores), got {}",
             o.threads);
  FSDP_CHECK(o.grad_accum >= 1, "[fsdp-train] --grad-accum must be >= 1, got {}", o.grad_accum);
  FSDP_CHECK(o.shard == "full" || o.shard == "none",
             "[fsdp-train] --shard must be full or none, got '{}'", o.shard);
  FSDP_CHECK(o.clip >= 0, "[fsdp-train] --clip must be >= 0 (0 = off), got {}", o.clip);
  const DType dtype = parse_dtype(o.dtype);
  FSDP_CHECK(dtype == DType::f32 || dtype == DType::f64,
             "[fsdp-train] --dtype {} is not a CPU training dtype; use f32 or f64 for the (master) "
             "parameters and "
             "--param-dtype bf16 for bf16 compute",
             o.dtype);
  const Device device = w.pg->device();
  FSDP_CHECK(device.is_cpu() || dtype == DType::f32,
             "[fsdp-train] --dtype {} on CUDA: the kernels take f32 (master) "
             "with --param-dtype bf16 or f16",
             o.dtype);
  MixedPrecisionPolicy mp;
  if (!o.param_dtype.empty()) mp.param_dtype = parse_dtype(o.param_dtype);
  if (!o.reduce_dtype.empty()) mp.reduce_dtype = parse_dtype(o.reduce_dtype);
  FSDP_CHECK(o.shard == "full" || (!mp.param_dtype && !mp.reduce_dtype),
             "[fsdp-train] --param-dtype and --reduce-dtype need --shard full (they are "
             "fully_shard's policy)");

  // Mesh: all ranks shard, or --hsdp R replica groups of size/R ranks each.
  if (o.hsdp > 0) {
    FSDP_CHECK(o.shard == "full", "[fsdp-train] --hsdp needs --shard full");
    FSDP_CHECK(w.size % o.hsdp == 0, "[fsdp-train] --hsdp {} does not divide the world size {}",
               o.hsdp, w.size);
    w.mesh = dist::init_device_mesh({o.hsdp, w.size / o.hsdp}, {"replicate", "shard"});
  } else {
    w.mesh = dist::init_device_mesh({w.size}, {"shard"});
  }

  const auto& info = dist::world_info();
  // Default threads: this rank's share of the cores it may run on (mpirun
  // binds each rank to a core unless told --bind-to none).
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t mask;
  const int allowed = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : hw;
  const int threads =
      o.threads > 0 ? o.threads : std::max(1, std::min(allowed, hw / std::max(1, info.local_size)));
  omp_set_num_threads(threads);

  FSDP_CHECK(o.lr_decay == "none" || o.lr_decay == "cosine" || o.lr_decay == "linear",
             "[fsdp-train] --lr-decay must be none, cosine or linear, got '{}'", o.lr_decay);
  FSDP_CHECK(
      o.warmup >= 0 && o.min_lr >= 0 && o.eval_every >= 0 && o.ckpt_every >= 0 && o.keep >= 0,
      "[fsdp-train] --warmup-steps, --min-lr, --eval-every, --ckpt-every and --keep must be >= 0");
  FSDP_CHECK(o.ckpt_every == 0 || !o.ckpt_dir.empty(),
             "[fsdp-train] --ckpt-every needs --ckpt-dir");
  FSDP_CHECK(!o.resume || !o.ckpt_dir.empty(), "[fsdp-train] --resume needs --ckpt-dir");
  FSDP_CHECK(o.shard == "full" || (o.ckpt_dir.empty() && !o.wd_2d_only),
             "[fsdp-train] checkpoints and --wd-2d-only need --shard full");

  std::unique_ptr<data::TokenSource> src, val;
  if (!o.data.empty()) {
    auto stream = data::open_token_stream(o.data, cfg.vocab, cfg.seq);
    if (o.shuffle) stream->set_shuffle(o.seed, cfg.seq);
    if (o.eval_every > 0 && o.val_data.empty()) {
      auto [train, tail] = stream->split_tail(o.val_fraction, cfg.seq);
      if (o.shuffle) train->set_shuffle(o.seed, cfg.seq);
      src = std::move(train);
      val = std::move(tail);
    } else {
      src = std::move(stream);
    }
    if (cfg.arch == nn::Arch::seed && w.main())
      fmt::print(stderr,
                 "warning: arch seed attends in both directions with no mask, so on text it sees "
                 "the next token "
                 "it must predict; use --arch llama to learn a language model\n");
  } else {
    src = std::make_unique<data::RandomTokenSource>(cfg.vocab, o.seed);
    if (o.eval_every > 0) val = std::make_unique<data::RandomTokenSource>(cfg.vocab, o.seed + 1);
  }
  if (!o.val_data.empty()) val = data::open_token_stream(o.val_data, cfg.vocab, cfg.seq);

  const int64_t mem_before = memory_stats(device).current;
  nn::MiniLLM model(cfg);
  nn::FlatParameters flat;  // --shard none only
  std::vector<nn::ParamGroup> groups;
  FSDPModule* root = nullptr;
  const int64_t shards = o.shard == "full" ? w.mesh->size(w.mesh->ndim() - 1) : 1;
  if (!o.init_from.empty()) {
    // Full weights from a file (PyTorch or Hugging Face names), sharded by fully_shard below.
    checkpoint::SafetensorsIndex file(o.init_from);
    auto full = nn::materialize(model, dtype, o.seed, device);
    for (auto& [name, p] : model.named_parameters()) {
      Tensor t = checkpoint::read_param(file, cfg, name);
      FSDP_CHECK(t.shape() == p->shape,
                 "[fsdp-train] --init-from {}: '{}' has shape {} but the model needs {}",
                 o.init_from, name, shape_str(t.shape()), shape_str(p->shape));
      p->data.copy_(t);
    }
    if (o.shard == "none") flat = full;
  }
  if (o.shard == "full") {
    FullyShardOptions fo{.reshard_after_forward = o.reshard_after_forward,
                         .mp_policy = mp,
                         .init_dtype = dtype,
                         .seed = o.seed};
    for (size_t i = 0; i < model.layers().size(); ++i) fully_shard(model.layers()[i], w.mesh, fo);
    root = &fully_shard(model, w.mesh, fo);
    groups = root->param_groups(o.weight_decay, !o.wd_2d_only);
  } else {
    if (!flat.params.defined()) flat = nn::materialize(model, dtype, o.seed, device);
    groups = {{flat.params, flat.grads, o.weight_decay}};
  }
  optim::AdamW opt(groups, {.lr = o.lr,
                            .beta1 = o.beta1,
                            .beta2 = o.beta2,
                            .eps = o.eps,
                            .weight_decay = o.weight_decay});
  const optim::LRSchedule schedule({.lr = o.lr,
                                    .warmup = o.warmup,
                                    .decay = optim::parse_decay(o.lr_decay),
                                    .min_lr = o.min_lr,
                                    .decay_end = o.decay_steps > 0 ? o.decay_steps : o.steps});
  const int64_t persistent_measured = memory_stats(device).current - mem_before;

  // The ceiling is the machine's sgemm peak on all its cores (measured by rank
  // 0 alone, so ranks do not compete for the cores while measuring), times
  // the number of machines.
  // On CUDA each rank has its own GPU: the ceiling is its GEMM peak in the
  // compute dtype, times the ranks.
  Tensor peak_t = Tensor::zeros({1}, DType::f32);
  if (device.is_cuda()) {
    peak_t.fill_(ops::device_gemm_peak_flops(device, mp.param_dtype.value_or(DType::f32)) / 1e9);
  } else if (w.main()) {
    peak_t.fill_(ops::sgemm_peak_flops(hw) / 1e9);
  }
  omp_set_num_threads(threads);
  Tensor peak_d = peak_t.to(device);
  w.pg->broadcast(peak_d, 0)->wait();
  const double per_node = device.is_cuda() ? double(std::max(1, info.local_size)) : 1.0;
  const double peak =
      peak_d.item() * 1e9 * per_node * double(w.size) / double(std::max(1, info.local_size));
  std::string dtypes;
  if (mp.param_dtype || mp.reduce_dtype)
    dtypes =
        fmt::format(" master, {} params, {} reduce", dtype_name(mp.param_dtype.value_or(dtype)),
                    dtype_name(mp.reduce_dtype.value_or(mp.param_dtype.value_or(dtype))));
  if (w.main()) {
    print_config(cfg, o, model.num_parameters(), dtype, threads, *src, peak, w, dtypes,
                 persistent_bytes(model, shards, dtype), persistent_measured);
    std::fflush(stdout);
  }

  // Communication per step: seconds in collectives on their threads, and
  // seconds the compute thread waited for them (exposed).
  double comm_total = 0, exposed_total = 0, step_total = 0;
  auto comm_now = [&]() -> std::pair<double, double> {
    if (root) {
      auto st = root->comm_stats();
      return {st.comm_seconds, st.exposed_seconds};
    }
    return {w.pg->comm_seconds(), 0.0};
  };
  double ddp_wait = 0;

  // The run's config, saved in checkpoints; the model keys must match on resume.
  const std::vector<std::string> model_keys = {"arch",  "vocab",      "dim",  "layers",
                                               "heads", "ffn_hidden", "dtype"};
  nlohmann::json run_config = nlohmann::json::parse(cfg.to_json());
  run_config.update({{"batch", cfg.batch},
                     {"world_size", w.size},
                     {"seed", o.seed},
                     {"dtype", std::string(dtype_name(dtype))},
                     {"lr", o.lr},
                     {"data", o.data}});
  const std::string config_json = run_config.dump();
  // Each rank's rows of each global batch; a step takes --grad-accum batches.
  data::DataLoader loader(std::shared_ptr<const data::TokenSource>(std::move(src)),
                          cfg.batch * w.size, w.rank, w.size, cfg.seq);
  int64_t start_step = 0;
  if (o.resume) {
    const std::string path = checkpoint::latest(o.ckpt_dir);
    if (path.empty()) {
      if (w.main()) fmt::print("resume: no checkpoint in {} yet; starting at step 0\n", o.ckpt_dir);
    } else {
      auto loaded = checkpoint::load(path, *root, opt, config_json, model_keys);
      start_step = loaded.step;
      loader.set_position(loaded.data_position);
      if (w.main()) fmt::print("resume: loaded {} (step {})\n", path, start_step);
    }
  }
  std::ofstream log_file;
  if (w.main() && !o.log_file.empty()) {
    log_file.open(o.log_file, start_step > 0 ? std::ios::app : std::ios::trunc);
    FSDP_CHECK(log_file.good(), "[fsdp-train] cannot write --log-file '{}'", o.log_file);
  }

  int64_t prof_begin = -1, prof_end = -1;
  if (!o.profile_steps.empty()) {
    const auto colon = o.profile_steps.find(':');
    try {
      FSDP_CHECK(colon != std::string::npos, "");
      prof_begin = std::stoll(o.profile_steps.substr(0, colon));
      prof_end = std::stoll(o.profile_steps.substr(colon + 1));
    } catch (const std::exception&) {
      FSDP_FAIL("[fsdp-train] --profile-steps '{}' must be A:B, the steps [A, B) to profile",
                o.profile_steps);
    }
    FSDP_CHECK(prof_begin >= 0 && prof_end > prof_begin,
               "[fsdp-train] --profile-steps '{}': need 0 <= A < B", o.profile_steps);
  }
  std::unique_ptr<profiler::Profiler> prof;
  auto finish_profile = [&] {
    if (!prof) return;
    prof->stop();
    std::filesystem::create_directories(o.profile_dir);
    const std::string trace = fmt::format("{}/trace_rank{}.json", o.profile_dir, w.rank);
    prof->export_chrome_trace(trace);
    const std::string table =
        prof->key_averages().table(device.is_cuda() ? "device_time_total" : "cpu_time_total", 15) +
        prof->overlap_summary() + "\n";
    std::ofstream(fmt::format("{}/table_rank{}.txt", o.profile_dir, w.rank)) << table;
    if (w.main())
      fmt::print("profile: steps {}:{} -> {} (and the other ranks')\n{}", prof_begin, prof_end,
                 trace, table);
    prof.reset();
  };

  const int64_t B = cfg.batch, T = cfg.seq, global_rows = B * w.size;
  const int64_t tokens_per_step = global_rows * T * o.grad_accum;
  for (int64_t step = start_step; step < o.steps; ++step) {
    if (step == prof_begin) {
      std::vector<profiler::Activity> acts = {profiler::Activity::CPU};
      if (device.is_cuda()) acts.push_back(profiler::Activity::CUDA);
      prof = std::make_unique<profiler::Profiler>(profiler::ProfilerOptions{
          .activities = acts, .record_shapes = true, .profile_memory = true, .rank = w.rank});
      prof->start();
    }
    if (step == prof_end) finish_profile();
    auto t0 = std::chrono::steady_clock::now();
    opt.set_lr(schedule.at(step));
    const auto [comm0, exposed0] = comm_now();
    const double ddp_wait0 = ddp_wait;
    if (root)
      root->zero_grad();
    else
      flat.grads.zero_();
    std::vector<Tensor> micro_losses;  // on the device until the step line reads them
    for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
      const bool sync = micro == o.grad_accum - 1;
      if (root) root->set_requires_gradient_sync(sync);
      data::Batch b = loader.next();
      b.inputs = b.inputs.to(device);
      b.targets = b.targets.to(device);
      nn::LMLoss loss;  // the loss stays on the device; dlogits overwrite the logits
      micro_losses.push_back(loss.forward(model.forward(b.inputs), b.targets));
      model.backward(loss.backward(1.0 / double(o.grad_accum)));
    }
    if (!root && w.size > 1) {
      auto tw = std::chrono::steady_clock::now();
      w.pg->all_reduce(flat.grads, dist::ReduceOp::AVG)->wait();
      ddp_wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - tw).count();
    }
    const auto [comm1, exposed1] = comm_now();
    const optim::GradNorm norm = optim::clip_grad_norm_async(
        groups, o.clip, root ? w.mesh->group(w.mesh->ndim() - 1) : nullptr);
    opt.step();
    // The step's one host sync: the loss and the grad norm, read after the optimizer's launches.
    double loss = 0;
    for (const Tensor& l : micro_losses) loss += l.item() / double(o.grad_accum);
    const double grad_norm = norm.value();
    // The printed loss is the mean over all ranks; peak mem is the largest rank's.
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    profiler::StepMetrics m =
        profiler::gather_step_metrics(*w.pg, device,
                                      {.step = step,
                                       .loss = loss,
                                       .grad_norm = grad_norm,
                                       .lr = opt.lr(),
                                       .step_seconds = dt,
                                       .tokens = tokens_per_step,
                                       .flops_per_token = cfg.flops_per_token(),
                                       .peak_flops = peak});
    FSDP_CHECK(std::isfinite(m.loss), "[fsdp-train] loss became {} at step {}; lower --lr", m.loss,
               step);
    if (step > start_step || o.steps == start_step + 1) {  // the first step warms up
      comm_total += comm1 - comm0;
      exposed_total += (exposed1 - exposed0) + (ddp_wait - ddp_wait0);
      step_total += dt;
    }
    if (w.main()) {
      fmt::print("{}\n", m.line());
      std::fflush(stdout);
    }
    if (val && o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps)) {
      double sum = 0;
      for (int64_t e = 0; e < o.eval_batches; ++e) {
        data::Batch b = val->batch(e, global_rows, w.rank * B, B, T);
        Tensor logits = model.forward(b.inputs.to(device)).view({B * T, cfg.vocab});
        sum += ops::cross_entropy_forward(logits, b.targets.to(device)).loss;
      }
      Tensor v = Tensor::full({1}, sum / double(o.eval_batches), DType::f64).to(device);
      w.pg->all_reduce(v, dist::ReduceOp::AVG)->wait();
      m.val_loss = v.item();
      if (w.main()) fmt::print("step {} | val loss {:.4f}\n", step, *m.val_loss);
    }
    if (log_file.is_open()) {
      log_file << m.json() << "\n";
      log_file.flush();
    }
    if (o.ckpt_every > 0 && ((step + 1) % o.ckpt_every == 0 || step + 1 == o.steps)) {
      auto tc = std::chrono::steady_clock::now();
      if (w.main()) fmt::print("checkpoint: writing step {} to {} ...\n", step + 1, o.ckpt_dir);
      checkpoint::save(o.ckpt_dir, step + 1, *root, opt, config_json, o.keep, w.pg,
                       {.data_position = loader.position()});
      if (w.main())
        fmt::print("checkpoint: done in {:.2f} s\n",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - tc).count());
    }
  }

  finish_profile();
  if (o.steps > 0) {
    // Means over the steps after the first; communication as rank 0 saw it.
    const double n = double(std::max<int64_t>(1, o.steps > 1 ? o.steps - 1 : 1));
    Tensor peak_mem = Tensor::full({1}, double(memory_stats(device).peak), DType::f64).to(device);
    Tensor peaks = Tensor::empty({w.size}, DType::f64, device);
    w.pg->all_gather_into_tensor(peaks, peak_mem)->wait();
    const auto pv = peaks.to_f64_vector();
    if (w.main()) {
      fmt::print("summary | step {:.1f} ms | peak mem {:.1f} MB", 1e3 * step_total / n,
                 *std::max_element(pv.begin(), pv.end()) / 1e6);
      if (w.size > 1)
        fmt::print(" | comm {:.1f} ms/step in collectives, {:.1f} ms/step exposed ({:.0f}%)",
                   1e3 * comm_total / n, 1e3 * exposed_total / n,
                   comm_total > 0 ? 100.0 * std::min(1.0, exposed_total / comm_total) : 0.0);
      fmt::print("\n");
    }
  }

  if (!o.data.empty() && o.sample_tokens > 0) {
    // Every rank samples in lockstep (sharded forwards are collective); rank 0 prints.
    std::vector<int32_t> prompt;
    for (unsigned char ch : o.prompt) prompt.push_back(int32_t(ch) % int32_t(cfg.vocab));
    std::string text;
    for (int32_t id : nn::sample(model, prompt,
                                 {.tokens = o.sample_tokens,
                                 .temperature = o.temperature,
                                 .max_id = 256,
                                 .seed = o.seed,
                                 .device = device}))
      text.push_back(char(id));
    for (char& ch : text)
      if ((unsigned char)ch < 32 && ch != '\n') ch = ' ';
    if (w.main()) fmt::print("sample: {}{}\n", o.prompt, text);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
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
  app.add_option("--device", o.device, "cpu or cuda (ranks take the GPU of their local rank; NCCL)")
      ->capture_default_str();
  app.add_option(
         "--backend", o.backend,
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
  app.add_option("--sample-tokens", o.sample_tokens, "bytes to sample after training on --data")
      ->capture_default_str();
  app.add_option("--prompt", o.prompt, "prompt for the sample")->capture_default_str();
  app.add_option("--temperature", o.temperature, "sampling temperature")->capture_default_str();
  app.add_option("--shard", o.shard,
                 "full: fully_shard every block and the root; none: DDP-style baseline")
      ->capture_default_str();
  app.add_option("--reshard-after-forward", o.reshard_after_forward,
                 "free each block's unsharded parameters after its forward (false: ZeRO-2 style)")
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
  app.add_flag("--resume", o.resume, "continue from the newest checkpoint in --ckpt-dir");
  app.add_option("--init-from", o.init_from, "initialise from full weights in a safetensors file");
  app.add_option("--log-file", o.log_file, "append one JSON object per step to this file");
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
    World w;
    const fsdp::Device device = fsdp::parse_device(o.device);
    FSDP_CHECK(
        device.is_cpu() || fsdp::cuda_available(),
        "[fsdp-train] --device {}: no CUDA device is visible (or fsdp.cpp was built without CUDA)",
        o.device);
    w.pg = fsdp::dist::init_process_group({.device = device, .backend = o.backend});
    w.rank = w.pg->rank();
    w.size = w.pg->size();
    int rc = run(o, w);
    w.mesh.reset();
    fsdp::dist::destroy_process_group();
    return rc;
  } catch (const std::exception& e) {
    // Peers may be waiting in a collective this rank will never join: end the
    // job instead of unwinding into destructors that wait for them.
    const int rank = fsdp::dist::is_initialized() ? fsdp::dist::world_info().rank : 0;
    fmt::print(stderr, "fsdp-train: error{}: {}\n", rank ? fmt::format(" (rank {})", rank) : "",
               e.what());
    fsdp::dist::abort_process(1);
  }
}
