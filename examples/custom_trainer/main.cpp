// A sharded trainer from the library's parts (tiny llama, fully_shard, AdamW, warmup + cosine) and
// fsdp-train's step; checkpoint::Manager saves and resumes. mpirun -np 2 custom_trainer DIR [STOP]
#include <fmt/core.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "fsdp/distributed/init.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/ops/blas.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/train/step.h"  // with the parts' headers: loader, schedule, checkpoint::Manager
using namespace fsdp;

int main(int argc, char** argv) try {
  ops::use_best_blas_kernel(argv);  // OpenBLAS's best kernels for this CPU (may re-execute)
  const int64_t steps = 20, stop = argc > 2 ? std::stoll(argv[2]) : steps, seed = 1;
  auto world = dist::init_process_group();
  auto mesh = dist::init_device_mesh({world->size()});
  nn::TransformerConfig cfg = nn::TransformerConfig::preset("tiny");
  cfg.arch = nn::Arch::llama;
  nn::Transformer model(cfg);
  for (nn::Module& block : model.layers()) fully_shard(block, mesh, {.seed = seed});
  FSDPModule& root = fully_shard(model, mesh, {.seed = seed});
  optim::AdamW opt(root.param_groups(0.01), {.lr = 1e-3, .weight_decay = 0.01});
  optim::LRSchedule lr(
      {.lr = 1e-3, .warmup = 5, .decay = optim::Decay::cosine, .min_lr = 1e-4, .decay_end = steps});
  data::DataLoader data(std::make_shared<data::RandomTokenSource>(cfg.vocab, seed), cfg.batch,
                        world->rank(), world->size(), cfg.seq);  // each rank's rows of cfg.batch
  checkpoint::Manager ckpt({.dir = argc > 1 ? argv[1] : "ckpt", .resume = true, .keep = 2}, world);
  // What a checkpoint holds: the shards, the optimizer, the config (its "arch" checked) and parts.
  const checkpoint::RunState run{root, opt, cfg.to_json(), {"arch"}, {{"data", &data}}};
  const auto loaded = ckpt.load(run);  // the newest complete one: shards, AdamW, data position
  const train::StepParts parts{.model = model, .parallel = root, .optimizer = opt, .loader = data,
                               .group = *world, .schedule = &lr, .checkpointer = &ckpt};
  for (int64_t step = loaded ? loaded->step : 0; step < stop; ++step) {
    const profiler::StepMetrics m = train::train_step(parts, step, {.grad_clip = 1.0});
    if (!world->rank()) fmt::print("{} | host syncs {}\n", m.line(), m.host_syncs);
    if ((step + 1) % 10 == 0) ckpt.save(step + 1, run);
  }
  dist::destroy_process_group();
} catch (const std::exception& e) {
  fmt::print(stderr, "custom_trainer: error: {}\n", e.what());
  dist::abort_process(1);
}
