// The model families fsdp-train builds, one row each (torchtitan's TrainSpec registry, small):
// the --arch name, how the model is built from its config, how it is parallelized, the config
// keys a resume must match, and the GEMM shapes its ceiling is measured at. The Trainer looks its
// row up by the config's arch and names no model; --arch reads its names from here.
//
// Both rows are nn::MiniLLM today (the seed architecture and llama are its two variants), so they
// share their functions; a family with its own module class is a row with its own.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "fsdp/distributed/device_mesh.h"
#include "fsdp/fsdp/data_parallel.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/minillm.h"
#include "fsdp/profiler/ceilings.h"
#include "fsdp/train/options.h"

namespace fsdp::train {

// How a model is spread over the ranks: FSDP2's recipe (fully_shard on each block, then on the
// root) or replicate() (the DDP baseline), then activation checkpointing on its blocks.
struct Parallelism {
  std::shared_ptr<dist::DeviceMesh> mesh;
  ShardMode shard = ShardMode::full;
  FullyShardOptions fsdp;  // full: each block's and the root's; none: its init_dtype and seed
  ActivationCheckpoint activation_checkpoint;
};

struct Parallelized {
  DataParallelModule* parallel = nullptr;  // the step's interface: the root, or replicate's
  FSDPModule* root = nullptr;              // ShardMode::full: the sharded root (checkpoints)
};

struct ModelFamily {
  nn::Arch arch;
  std::string_view name;  // --arch's value, and the config JSON's "arch"
  std::string_view what;
  std::unique_ptr<nn::MiniLLM> (*build)(const nn::MiniLLMConfig& config);
  Parallelized (*parallelize)(nn::MiniLLM& model, const Parallelism& p);
  // The model config's keys that a checkpoint and the run resuming it must agree on.
  std::span<const std::string_view> shape_keys;
  // The GEMMs of one rank's forward (rows: its tokens) and its largest weight gradient.
  std::vector<profiler::GemmShape> (*gemm_shapes)(const nn::MiniLLMConfig& config);
};

std::span<const ModelFamily> model_families();
const ModelFamily& model_family(nn::Arch arch);

}  // namespace fsdp::train
