// fsdp-train's loop over the library's parts, resuming: mpirun -np 2 custom_trainer DIR [STOP]
#include <fmt/core.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "fsdp/distributed/init.h"
#include "fsdp/models/spec.h"
#include "fsdp/ops/blas.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/train/step.h"  // with the parts' headers: loader, schedule, checkpoint::Manager
using namespace fsdp;

int main(int argc, char** argv) try {
  ops::use_best_blas_kernel(argv);  // OpenBLAS's best kernels for this CPU (may re-execute)
  auto world = dist::init_process_group();
  const nn::TransformerConfig cfg = nn::TransformerConfig::preset("tiny");  // the seed MiniLLM's
  auto model = models::spec_of(cfg).build(cfg);  // the family's module tree, then its FSDP plan
  FSDPModule& root = *models::spec_of(cfg).parallelize(*model, {.fsdp = {.seed = 1}}).root;
  optim::AdamW opt(root.param_groups(0.01), {.lr = 1e-3, .weight_decay = 0.01});
  optim::LRSchedule lr({.lr = 1e-3, .warmup = 5, .decay = optim::Decay::cosine, .decay_end = 20});
  data::DataLoader data(std::make_shared<data::RandomTokenSource>(cfg.vocab, 1), cfg.batch,
                        world->rank(), world->size(), cfg.seq);  // each rank's rows of cfg.batch
  checkpoint::Manager ckpt({.dir = argc > 1 ? argv[1] : "ckpt", .resume = true}, world);
  const checkpoint::RunState run{root, opt, cfg.to_json(), {"arch"}, {{"data", &data}}};
  const auto loaded = ckpt.load(run);  // the newest: shards, AdamW, config ("arch" checked), data
  const int64_t start = loaded ? loaded->step : 0, end = argc > 2 ? std::stoll(argv[2]) : 20;
  const auto print = [&](const profiler::StepMetrics& m) {
    if (!world->rank()) fmt::print("{} | host syncs {}\n", m.line(), m.host_syncs);
  };
  train::train_loop({*model, root, opt, data, *world, &lr, &ckpt},  // fsdp-train's parts
                    {.start = start, .steps = end, .save_every = 10, .run = &run},
                    {.on_step_end = print});
  dist::destroy_process_group();
} catch (const std::exception& e) {
  dist::abort_process(e, "custom_trainer");  // the message, and every rank's process ended
}
