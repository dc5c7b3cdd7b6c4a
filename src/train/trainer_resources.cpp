// Trainer::Impl's resources: the memory plan checked against what the host or device has left,
// and the FLOP/s ceiling MFU is measured against.
#include <fmt/core.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/dtype.h"
#include "fsdp/core/env.h"
#include "fsdp/core/error.h"
#include "fsdp/core/host_memory.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/models/spec.h"
#include "fsdp/profiler/ceilings.h"
#include "fsdp/profiler/metrics.h"
#include "fsdp/nn/module.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/train/memory_plan.h"
#include "fsdp/train/preference.h"
#include "src/train/trainer_impl.h"

namespace fsdp::train {

// The memory plan (train/memory_plan.h): this rank's predicted peak, from the shapes alone,
// against what is left for this host's ranks (CPU: the cgroup's limit or MemAvailable, for what
// each rank will add to what it holds now; CUDA: the device's free memory); refused with the
// numbers on every rank alike (--allow-oversubscribe-memory skips it). A 38B model under a
// 3 GiB cgroup was OOM-killed after 3 s with no output.
void Trainer::Impl::check_memory_plan() {
  const int64_t held = device.is_cpu() ? resident_bytes() : 0;
  MemoryPlanOptions po{
      .model = cfg,
      .device = device,
      .fully_shard = o.sharding.shard == ShardMode::full,
      .shards = o.sharding.shard == ShardMode::full ? mesh->size(mesh->ndim() - 1) : 1,
      .replicas = o.sharding.shard == ShardMode::full && mesh->ndim() == 2 ? mesh->size(0) : 1,
      .reshard_after_forward = o.sharding.reshard_after_forward,
      .dtype = dtype,
      .param_dtype = mp.param_dtype,
      .reduce_dtype = mp.reduce_dtype,
      .frozen_dtype = frozen_dtype,
      .frozen_packed = frozen_packed,
      .grad_accum = o.sharding.grad_accum,
      .checkpoint_every = o.sharding.activation_checkpoint.every,
      .expert_parallel = o.sharding.expert_parallel,
      .fused_loss = o.sharding.fused_loss,
      .loss = parts.loss.get(),  // the parts this trainer holds, planned as they are
      .optimizer = parts.optimizer,
      .threads = threads,
      .cpu_cache_bytes = int64_t(env_double("FSDP_CPU_CACHE_MB") * 1048576.0),
      .baseline_bytes = held};
  // A preference loss's frozen reference model (build_reference's, of the policy's shape), planned
  // as it will be made; the plan's copy is detached from the loss after the plan.
  PreferenceLoss* pref = separate_reference_loss();
  if (pref)
    po.reference = [this, pref](std::shared_ptr<dist::DeviceMesh> m, const FullyShardOptions& f) {
      nn::TransformerConfig rc = cfg;
      rc.lora = {};
      std::unique_ptr<nn::Transformer> ref = family->build(rc);
      for (auto& [name, p] : ref->named_parameters()) p->requires_grad = false;
      FullyShardOptions frozen = f;
      frozen.reshard_after_forward = true;
      family->parallelize(*ref, {.mesh = m, .replicate = false, .fsdp = frozen,
                                 .checkpoint_every = 0,
                                 .expert_mesh = o.sharding.expert_parallel > 1
                                                    ? dist::make_expert_mesh(m->group(0),
                                                                             o.sharding.expert_parallel)
                                                    : nullptr});
      pref->set_reference_model(ref.get());
      return std::unique_ptr<nn::Module>(std::move(ref));
    };
  const int local = device.is_cpu() ? std::max(1, dist::world_info().local_size) : 1;
  const auto [available, from] =
      device.is_cpu()
          ? host_memory_available()
          : std::pair{cuda_memory_info(device.index).free, fmt::format("free on {}", device.str())};
  // The persistent bytes alone, by arithmetic (a crafted --layers 1e8 would take the plan's meta
  // model itself out of memory): a model that cannot fit by them is refused before the plan.
  // (LoRA: the frozen base holds its parameters only; the adapters the four copies.)
  const long double trained =
      cfg.lora.enabled() ? (long double)cfg.lora_parameters() : (long double)models::num_parameters(cfg);
  long double frozen_bytes = ((long double)models::num_parameters(cfg) - trained) *
                             (long double)dtype_size(frozen_dtype.value_or(dtype));
  if (frozen_packed) {  // a kept base: its stored bytes (the file's layers, checked on opening)
    frozen_bytes = 0;
    const auto shapes = models::spec_to_train(cfg).build(cfg);  // no storage
    for (auto& [name, p] : shapes->named_parameters())
      if (!p->requires_grad) {
        const auto rows = frozen_packed(name);
        frozen_bytes += rows ? (long double)rows->bytes(0, rows->rows())
                             : (long double)shape_numel(p->shape) *
                                   (long double)dtype_size(frozen_dtype.value_or(dtype));
      }
  }
  if (pref)  // the reference's frozen copy of the base
    frozen_bytes += (long double)(models::num_parameters(cfg) - (cfg.lora.enabled() ? cfg.lora_parameters() : 0)) *
                    (long double)dtype_size(frozen_dtype.value_or(dtype));
  const long double lower = (frozen_bytes + 4.0L * trained * (long double)dtype_size(dtype)) /
                            (long double)std::max<int64_t>(1, po.shards);
  std::string error;
  if (!o.sharding.allow_oversubscribe_memory && available >= 0 &&
      lower * local > (long double)available) {
    error = fmt::format(
        "[fsdp-train] the model does not fit: {} parameters need {:.2f} GB per rank for "
        "parameters, gradients and AdamW's two moments alone ({}, {} shard(s)), {:.2f} GB for the "
        "{} rank(s) on this {}, but only {:.2f} GB is available ({}); shard over more ranks, "
        "take a smaller model, or pass --allow-oversubscribe-memory to try anyway",
        models::num_parameters(cfg), double(lower / 1e9L), dtype_name(dtype), po.shards,
        double(lower * local / 1e9L), local, device.is_cpu() ? "host" : "device",
        double(available) / 1e9, from);
  } else {
    try {
      struct Detach {  // the plan's reference goes with the plan
        PreferenceLoss* pref;
        ~Detach() {
          if (pref) pref->set_reference_model(nullptr);
        }
      } detach{pref};
      plan = plan_memory(po);  // the first steps run on the meta device
    } catch (const std::bad_alloc&) {  // agreed below, as the refusals are
      error = fmt::format(
          "[fsdp-train] the memory plan of {} layers ({} parameters) ran out of memory itself: "
          "the model is far too large for this machine",
          cfg.layers, models::num_parameters(cfg));
    }
    if (error.empty() && o.sharding.allow_oversubscribe_memory) return;
  }
  const int64_t more = plan.peak - held;  // what this rank will still take
  if (error.empty() && available >= 0 && more * local > available) {
    std::string terms;
    for (const MemoryTerm& t : plan.terms)
      if (t.bytes > 0)
        terms +=
            fmt::format("{}{} {:.2f}", terms.empty() ? "" : ", ", t.name, double(t.bytes) / 1e9);
    error = fmt::format(
        "[fsdp-train] the model does not fit: {} parameters need {:.2f} GB per rank for "
        "parameters, gradients and AdamW's two moments ({}, {} shard(s)) and {:.2f} GB at the "
        "predicted peak of a step (batch {} x seq {}: {}), {:.2f} GB more than a rank holds now, "
        "{:.2f} GB for the {} rank(s) on this {}, but only {:.2f} GB is available ({}); shard over "
        "more ranks, take a smaller model or batch, use --activation-checkpoint, or pass "
        "--allow-oversubscribe-memory to try anyway",
        models::num_parameters(cfg), double(plan.persistent) / 1e9, dtype_name(dtype), po.shards,
        double(plan.peak) / 1e9, cfg.batch, cfg.seq, terms, double(more) / 1e9,
        double(more * local) / 1e9, local, device.is_cpu() ? "host" : "device",
        double(available) / 1e9, from);
  }
  Tensor failed = Tensor::full({1}, error.empty() ? 0.0 : 1.0, DType::f32).to(device);
  if (size > 1) pg->all_reduce(failed, dist::ReduceOp::SUM)->wait();
  if (!error.empty()) throw Error(error);
  FSDP_CHECK(failed.item() == 0,
             "[fsdp-train] the model does not fit in {} other rank(s)' memory (their errors "
             "give the numbers); pass --allow-oversubscribe-memory to try anyway",
             failed.item());
}

// The ceiling: on CPU the machine's sgemm peak on all its cores (measured by
// rank 0 alone, so ranks do not compete for the cores while measuring), times
// the number of machines; on CUDA each rank's GEMM peak in the compute dtype,
// times the ranks.
void Trainer::Impl::measure_peak() {
  const int local = std::max(1, dist::world_info().local_size);
  Tensor peak_t = Tensor::zeros({1}, DType::f32);
  if (device.is_cuda()) {
    peak_t.fill_(profiler::device_gemm_peak_flops(device, mp.param_dtype.value_or(DType::f32)) /
                 1e9);
  } else if (main()) {
    peak_t.fill_(profiler::sgemm_peak_flops(peak_threads(), family->gemm_shapes(cfg)) / 1e9);
  }
  omp_set_num_threads(threads);
  Tensor peak_d = peak_t.to(device);
  pg->broadcast(peak_d, 0)->wait();
  peak_units = device.is_cuda() ? double(size) : double(size) / double(local);
  peak = peak_d.item() * 1e9 * peak_units;
  peak_measured = peak;
}

// A step that ran faster than the peak proves the peak low (measured while the machine was
// busy, say): the peak is raised to the step's rate, here and (rank 0) in the cache, so MFU
// never reads above 100%; the summary says so.
void Trainer::Impl::raise_peak(profiler::StepMetrics& m) {
  if (!(m.mfu > 1)) return;
  peak *= m.mfu;
  m.mfu = 1;
  if (!main()) return;
  if (device.is_cuda())
    profiler::raise_device_gemm_peak(device, mp.param_dtype.value_or(DType::f32),
                                     peak / peak_units);
  else
    profiler::raise_sgemm_peak(peak_threads(), peak / peak_units);
}

}  // namespace fsdp::train
