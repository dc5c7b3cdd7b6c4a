// The memory plan: one rank's peak memory in a training step, predicted from the run's shapes
// before any tensor exists, so that a run that cannot fit is refused with the numbers instead of
// being ended by the out-of-memory killer, and so that a run's measured peak can be checked
// against what it should be.
//
// The plan is not a formula, nor a hand-kept copy of the step: it is the step. The run's model is
// built by its family's spec on the meta device (fsdp/core/meta.h: shapes, no storage), sharded by
// fully_shard over a meta group of the real world size (this process stands for rank 0; its
// collectives move nothing), given the trainer's optimizer (AdamW by default) and loss, and trained
// two steps by train_step (the second starts
// with the first's staged batch and its blocks' sizes cached). Every allocation the real code
// makes (nn's forward and backward, fully_shard's all-gather and reduce-scatter buffers, activation
// recompute, the loss, the CPU ops' widened copies, kernel scratch) goes, in its order, through the
// meta allocator's model of the device's allocator. On CPU that is core/allocator.cpp's caching
// allocator: a freed block of 64 KiB or more is kept (up to FSDP_CPU_CACHE_MB) for a later request
// of the same page-rounded size, so the resident peak is more than the peak of live bytes whenever
// a size's most-used moment is not the step's. The peak is what the process holds: on CPU its
// resident set (VmHWM, with the baseline the process held before any tensor), on CUDA the device
// allocator's peak. Each term says what holds its bytes at that moment (the meta::TermScope the
// code allocated them under). On CUDA the ops are still the CPU backend's: its widened f32 copies
// of bf16 are an upper bound there, and cuBLASLt's and cuDNN's workspaces are not counted. A
// collective's buffers are held until it is waited for (the CPU engines hold them at most that
// long).
//
// Kept honest by tests/memory_plan_test.sh: the prediction against the measured peak at np 1 and 2,
// with and without activation checkpointing, LoRA and QLoRA's packed base.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/fsdp/data_parallel.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/module.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/optim/optimizer.h"
#include "fsdp/train/loss.h"

namespace fsdp::train {

// A caller's model, made for the plan: the module tree and its data-parallel root.
struct PlannedModel {
  std::unique_ptr<nn::Module> model;
  DataParallelModule* parallel = nullptr;  // the model's fully_shard root, or replicate()'s
};

struct MemoryPlanOptions {
  // The family's model (models::spec_to_train), unless `build` is given; its vocab, seq and
  // batch (this rank's rows of one microbatch) shape the batches either way.
  nn::TransformerConfig model;
  // A model of the caller's in place of the family's: made, and sharded over `mesh` (the meta
  // group of the planned world) with `fsdp` (the plan's dtypes and resharding), as its trainer
  // makes it. Null: the family's build and parallelize.
  std::function<PlannedModel(std::shared_ptr<dist::DeviceMesh> mesh, const FullyShardOptions& fsdp)>
      build;
  Device device = Device::cpu();
  bool fully_shard = true;  // false: --shard none, every rank holds flat replicated buffers
  int64_t shards = 1;       // ranks each parameter is sharded over
  int64_t replicas = 1;     // HSDP replica groups (the reduced gradients are all-reduced over them)
  bool reshard_after_forward = true;
  DType dtype = DType::f32;  // master parameters, their gradients and AdamW's two moments
  std::optional<DType> param_dtype, reduce_dtype;  // fully_shard's MixedPrecisionPolicy
  std::optional<DType> frozen_dtype;  // the frozen parameters' (a LoRA base): unset, dtype's
  // The frozen parameters kept packed (QLoRA's quantized base: fully_shard's frozen_packed), by
  // full name; their shards are these bytes, gathered as bytes.
  std::function<std::optional<PackedRows>(const std::string& name)> frozen_packed;
  int64_t grad_accum = 1;
  int64_t checkpoint_every = 0;  // checkpoint_every_blocks(): 0 none, 1 full, N blocks 0, N, ...
  // > 1: the MoE layers' experts split over ep groups of this many ranks (make_expert_mesh over
  // the plan's group), as fsdp-train --expert-parallel lays them out; fully_shard, no replicas.
  int64_t expert_parallel = 1;
  bool fused_loss = true;        // nn::ChunkedLMLoss: one chunk's logits, not [rows, vocab]
  // The parts the trainer holds (train::TrainerParts), planned as they are, not rebuilt from
  // options: its loss, run by train_step as in training (null: CrossEntropy{fused_loss}), and
  // how it makes its optimizer, called over the meta model's parameter groups (null: AdamW; the
  // groups' weight decay is 0, which changes no state's size).
  Loss* loss = nullptr;
  optim::OptimizerFactory optimizer;
  // A second model the loss runs (a preference loss's frozen reference): made by this on the
  // plan's mesh with `fsdp` (its shards in the persistent term), run by the loss through the
  // planned steps, and destroyed after them. The callback attaches it to the loss; the caller
  // detaches it after the plan. Empty: none.
  std::function<std::unique_ptr<nn::Module>(std::shared_ptr<dist::DeviceMesh> mesh,
                                            const FullyShardOptions& fsdp)>
      reference;
  int threads = 1;               // CPU attention scratch is per thread
  int64_t cpu_cache_bytes = 0;   // the most freed bytes the CPU allocator keeps (FSDP_CPU_CACHE_MB)
  // What the process holds before any tensor (runtime, libraries, thread pools, the data) and
  // what the runtime adds once training starts (communication threads, BLAS buffers): CPU only.
  int64_t baseline_bytes = 0;
};

struct MemoryTerm {
  std::string name;  // "activations"
  std::string what;  // what holds the bytes
  int64_t bytes = 0;
};

struct MemoryPlan {
  std::vector<MemoryTerm> terms;  // at the predicted peak; they sum to `peak`
  int64_t peak = 0;               // CPU: resident bytes (VmHWM); CUDA: the allocator's peak
  int64_t peak_allocated = 0;     // the allocator's peak of live bytes (fsdp-train's "peak mem")
  int64_t persistent = 0;         // sharded parameters, gradients and AdamW state
  std::string at;                 // where in the step the peak falls: "backward of layers.3.ffn"
  std::string loss;               // the loss planned (Loss::describe())
  int64_t loss_bytes = 0;         // the most its own buffers held at any moment (term "loss")
};

// The plan for one rank. Throws, naming the value, on an option out of range.
MemoryPlan plan_memory(const MemoryPlanOptions& options);

}  // namespace fsdp::train
