// What rank 0 prints: the run's table, the summary line, the sample.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/core/allocator.h"
#include "fsdp/core/host_memory.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/sample.h"
#include "fsdp/ops/attention_path.h"
#include "fsdp/ops/blas.h"
#include "fsdp/ops/rope.h"
#include "fsdp/profiler/ceilings.h"
#include "fsdp/train/memory_plan.h"
#include "src/train/trainer_impl.h"

namespace fsdp::train {

void Trainer::Impl::print_config(int64_t persistent, int64_t persistent_measured) const {
  auto row = [](const std::string& k, const std::string& v) {
    fmt::print("| {:<22} | {:<44} |\n", k, v);
  };
  std::string dtypes;
  if (mp.param_dtype || mp.reduce_dtype)
    dtypes =
        fmt::format(" master, {} params, {} reduce", dtype_name(mp.param_dtype.value_or(dtype)),
                    dtype_name(mp.reduce_dtype.value_or(mp.param_dtype.value_or(dtype))));
  fmt::print("+{:-<24}+{:-<46}+\n", "", "");
  row("preset / arch", pretrained && pretrained->config
                           ? fmt::format("{} {} / {}", pretrained->format, pretrained->family,
                                         nn::arch_name(cfg.arch))
                           : fmt::format("{} / {}", o.model.preset, nn::arch_name(cfg.arch)));
  row("vocab / dim / layers", fmt::format("{} / {} / {}", cfg.vocab, cfg.dim, cfg.layers));
  row("heads / ffn hidden", fmt::format("{} / {}", cfg.heads, cfg.resolved_ffn_hidden()));
  if (cfg.resolved_kv_heads() != cfg.heads || cfg.resolved_head_dim() * cfg.heads != cfg.dim ||
      cfg.tie_embeddings || cfg.qkv_bias || cfg.qk_norm)
    row("kv heads / head dim",
        fmt::format("{} / {}{}{}{}", cfg.resolved_kv_heads(), cfg.resolved_head_dim(),
                    cfg.tie_embeddings ? ", tied head" : "", cfg.qkv_bias ? ", qkv bias" : "",
                    cfg.qk_norm ? ", qk norm" : ""));
  if (cfg.sliding_window > 0 || cfg.norm_plus_one || cfg.sandwich_norms || cfg.geglu ||
      cfg.embed_scale) {
    int64_t local = 0;
    for (int64_t i = 0; i < cfg.layers; ++i) local += cfg.layer_window(i) > 0;
    std::string what = cfg.sliding_window > 0 ? fmt::format("window {} on {}/{};",
                                                            cfg.sliding_window, local, cfg.layers)
                                              : "no window;";
    for (const auto& [on, name] : {std::pair<bool, const char*>{cfg.norm_plus_one, "1+w"},
                                   {cfg.sandwich_norms, "sandwich"},
                                   {cfg.geglu, "geglu"},
                                   {cfg.embed_scale, "emb-scale"}})
      if (on) what += std::string(" ") + name;
    row("local layers / norms", what);
  }
  if (const ops::RopeScaling& s = cfg.rope_scaling; s.enabled())
    row("rope scaling", fmt::format("{} x{:g}, freq factors {:g}/{:g} of {:g}", ops::kRopeScalingType,
                                    s.factor, s.low_freq_factor, s.high_freq_factor,
                                    s.original_context));
  row("seq x batch",
      fmt::format("{} x {} x {} ranks x {} accum = {} tokens/step", cfg.seq, cfg.batch, size,
                  o.sharding.grad_accum, cfg.seq * cfg.batch * size * o.sharding.grad_accum));
  const int64_t nparams = model->num_parameters();
  row("parameters", fmt::format("{} ({:.2f} M)", nparams, double(nparams) / 1e6));
  if (const nn::MoEConfig& moe = cfg.moe; moe.enabled())
    row("experts",
        fmt::format("{} per MoE block ({} of {} blocks), top {} of {} wide{}: {} active "
                    "parameters ({:.2f} M; FLOPs and MFU count these), router loss x{:g}{}",
                    moe.experts, moe.sparse_layers(cfg.layers), cfg.layers, moe.top_k,
                    moe.hidden, moe.norm_topk_prob ? ", renormalized" : "",
                    cfg.active_parameters(), double(cfg.active_parameters()) / 1e6, moe.aux_coef,
                    moe.z_coef > 0 ? fmt::format(", z-loss x{:g}", moe.z_coef) : ""));
  if (cfg.lora.enabled())
    row("LoRA",
        fmt::format("rank {} alpha {} on {}: {} trained ({:.2f}%), the rest frozen", cfg.lora.rank,
                    cfg.lora.alpha, nn::lora_target_names(cfg.lora.targets), cfg.lora_parameters(),
                    100.0 * double(cfg.lora_parameters()) / double(std::max<int64_t>(1, nparams))));
  if (cfg.lora.enabled() && root) {  // the frozen base's storage on this rank
    int64_t held = 0;
    for (const nn::ParamGroup& g : root->param_groups(0))
      if (!g.grads.defined()) held += int64_t(g.params.nbytes());
    const int64_t frozen = nparams - cfg.lora_parameters();
    const DType base = frozen_dtype.value_or(dtype);
    const double as_float =
        double(frozen) * double(dtype_size(base)) / double(std::max(1, root->shard_count()));
    std::map<std::string, int> types;  // the packed weights' stored types
    if (frozen_packed)
      for (auto& [name, p] : model->named_parameters())
        if (!p->requires_grad)
          if (auto rows = frozen_packed(name))
            for (const PackedRows::Run& r : rows->runs)
              ++types[checkpoint::ggml_type_name(r.format)];
    std::string kinds;
    for (const auto& [t, count] : types)
      kinds += fmt::format("{}{} x{}", kinds.empty() ? "" : ", ", t, count);
    row("frozen base / rank",
        types.empty() ? fmt::format("{:.1f} MB in {}", double(held) / 1e6, dtype_name(base))
                      : fmt::format("{:.1f} MB as the GGUF's blocks ({} tensors) and {} norms; "
                                    "{:.1f} MB were it {}",
                                    double(held) / 1e6, kinds, dtype_name(base), as_float / 1e6,
                                    dtype_name(base)));
  }
  row("dtype", frozen_dtype ? fmt::format("{} base (frozen), f32 adapter{}",
                                          dtype_name(*frozen_dtype), dtypes)
                            : std::string(dtype_name(dtype)) + dtypes);
  row("optimizer", given_optimizer
                       ? std::string("the caller's (TrainerParts::optimizer)")
                       : fmt::format("AdamW lr {:g} betas ({:g}, {:g}) wd {:g}", o.optimizer.lr,
                                     o.optimizer.beta1, o.optimizer.beta2,
                                     o.optimizer.weight_decay));
  row("loss", parts.loss->describe());
  row("steps / seed", fmt::format("{} / {}", o.schedule.steps, o.run.seed));
  row("data", src->describe());
  row("tokenizer", tokenizer ? tokenizer->describe() : "none (random ids)");
  row("world size", fmt::format("{} ({}, {})", size, pg->backend(), dist::world_info().launcher));
  row("sharding",
      o.sharding.shard == ShardMode::none
          ? std::string("none (DDP-style baseline)")
          : fmt::format("fully_shard on {}{}", mesh->str(),
                        o.sharding.reshard_after_forward ? "" : ", no reshard after forward"));
  if (expert_mesh) {
    const int64_t ep = expert_mesh->size(1), per_rank = cfg.moe.experts / ep;
    row("expert parallel",
        fmt::format("EP {} x FSDP {}: {} experts per rank (of {}), sharded over the {} rank(s) "
                    "that hold them; tokens by all-to-all",
                    ep, expert_mesh->size(0), per_rank, cfg.moe.experts, expert_mesh->size(0)));
  }
  if (const int64_t every = o.sharding.activation_checkpoint.every; every > 0)
    row("activation ckpt", every == 1 ? std::string("every block (recomputed in the backward)")
                                      : fmt::format("blocks 0, {0}, 2x{0}, ... (recomputed in the "
                                                    "backward)",
                                                    every));
  row("persistent mem / rank",
      fmt::format("{:.3f} MB formula, {:.3f} MB measured", double(persistent) / 1e6,
                  double(persistent_measured) / 1e6));
  row("peak mem plan / rank", fmt::format("{:.1f} MB{} at {}", double(plan.peak) / 1e6,
                                          device.is_cpu() ? " resident" : "", plan.at));
  for (const MemoryTerm& t : plan.terms)
    row("  " + t.name, fmt::format("{:.1f} MB {}", double(t.bytes) / 1e6, t.what));
  row("  allocated at peak",
      fmt::format("{:.1f} MB (the allocator's own peak)", double(plan.peak_allocated) / 1e6));
  const auto path = [&](int64_t window) {
    return ops::attention_path(device, mp.param_dtype.value_or(dtype), cfg.batch, cfg.seq,
                               cfg.heads, cfg.resolved_kv_heads(), cfg.resolved_head_dim(),
                               cfg.arch == nn::Arch::decoder, window);
  };
  if (cfg.sliding_window > 0 && cfg.arch == nn::Arch::decoder) {  // local layers, and global ones
    row("attention (local)", path(cfg.sliding_window));
    if (cfg.global_every > 0) row("attention (global)", path(0));
  } else {
    row("attention", path(0));
  }
  row("threads", std::to_string(threads));
  if (device.is_cpu()) {
    row("blas library", ops::blas_library());
    row("blas kernels", ops::blas_kernel_note());
    if (mp.param_dtype.value_or(dtype) == DType::bf16)
      row("bf16 gemm", ops::bf16_gemm_name());
  }
  row("sgemm peak", fmt::format("{:.1f} GFLOP/s, all ranks (MFU denominator)", peak / 1e9));
  row("FLOPs / token", fmt::format("{:.3g}", cfg.flops_per_token()));
  fmt::print("+{:-<24}+{:-<46}+\n", "", "");
}

// Means over the steps after the first; communication as rank 0 saw it.
void Trainer::Impl::print_summary() {
  const double n = double(std::max<int64_t>(1, steps_timed));
  Tensor peak_mem = Tensor::full({2}, double(memory_stats(device).peak), DType::f64);
  peak_mem.data<double>()[1] = double(peak_resident_bytes());
  peak_mem = peak_mem.to(device);
  Tensor peaks = Tensor::empty({2 * size}, DType::f64, device);
  pg->all_gather_into_tensor(peaks, peak_mem)->wait();
  const auto pv = peaks.to_f64_vector();
  if (!main()) return;
  std::string rss;  // each rank's peak resident memory (VmHWM), MB
  double peak_alloc = 0;
  for (int r = 0; r < size; ++r) {
    peak_alloc = std::max(peak_alloc, pv[size_t(2 * r)]);
    rss += fmt::format("{}{:.0f}", r ? "/" : "", pv[size_t(2 * r + 1)] / 1e6);
  }
  fmt::print("summary | step {:.1f} ms | peak mem {:.1f} MB | peak rss {} MB", 1e3 * step_total / n,
             peak_alloc / 1e6, rss);
  // The plan is rank 0's: against rank 0's resident peak (CPU) or its allocator's (CUDA).
  const double measured = device.is_cpu() ? pv[1] : pv[0];
  fmt::print(" | plan {:.1f} MB{} (measured/plan {:.3f}), {:.1f} MB allocated ({:.3f})",
             double(plan.peak) / 1e6, device.is_cpu() ? " resident" : "",
             measured / double(std::max<int64_t>(1, plan.peak)), double(plan.peak_allocated) / 1e6,
             pv[0] / double(std::max<int64_t>(1, plan.peak_allocated)));
  if (size > 1)
    fmt::print(
        " | comm {:.1f} ms/step in collectives, {:.1f} ms/step exposed ({:.0f}%), "
        "all-gather {:.1f} MB/step",
        1e3 * comm_total / n, 1e3 * exposed_total / n,
        comm_total > 0 ? 100.0 * std::min(1.0, exposed_total / comm_total) : 0.0,
        gather_total / n / 1e6);
  fmt::print("\n");
  // The run: its wall time from the first step, the tokens it trained on, their mean rate.
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - fit_start).count();
  const int64_t tokens =
      (steps_done - start_step) * cfg.batch * size * cfg.seq * o.sharding.grad_accum;
  fmt::print("run | wall {} ({:.1f} s) | {} steps | {} tokens | {:.0f} tok/s mean{}\n",
             profiler::short_duration(wall), wall, steps_done - start_step, tokens,
             wall > 0 ? double(tokens) / wall : 0.0,
             best_val_loss ? fmt::format(" | best val loss {:.4f}", *best_val_loss) : "");
  if (peak > peak_measured)
    fmt::print(
        "peak | raised from {:.1f} to {:.1f} GFLOP/s (all ranks) by a step's observed "
        "rate, cached in {}; MFU is against it\n",
        peak_measured / 1e9, peak / 1e9,
        device.is_cuda() ? profiler::device_gemm_peak_cache_path()
                         : profiler::sgemm_peak_cache_path());
}

// Every rank samples in lockstep (sharded forwards are collective); rank 0 prints.
void Trainer::Impl::print_sample() {
  const std::vector<int32_t> ids = nn::sample(*model, tokenizer->encode(o.sample.prompt),
                                              {.tokens = o.sample.sample_tokens,
                                               .temperature = o.sample.temperature,
                                               .max_id = tokenizer->size(),
                                               .seed = o.run.seed,
                                               .device = device,
                                               .stop_id = tokenizer->eos_id(),
                                               .on_token = nullptr});
  std::string text = tokenizer->decode(ids);
  for (char& ch : text)
    if (static_cast<unsigned char>(ch) < 32 && ch != '\n') ch = ' ';
  if (main()) fmt::print("sample: {}{}\n", o.sample.prompt, text);
}

}  // namespace fsdp::train
