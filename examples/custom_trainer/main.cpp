// A sharded trainer from the library's parts: tiny llama, fully_shard, AdamW, warmup + cosine,
// clipping, a checkpoint every 10 steps, resume (fsdp-train's checkpoint::Manager: the folder is
// locked, the newest complete checkpoint is loaded). mpirun -np 2 custom_trainer CKPT_DIR [STOP_AT]
#include <fmt/core.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "fsdp/checkpoint/manager.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/loss.h"
#include "fsdp/nn/minillm.h"
#include "fsdp/ops/blas.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/clip.h"
#include "fsdp/optim/lr_schedule.h"
using namespace fsdp;

int main(int argc, char** argv) try {
  ops::use_best_blas_kernel(argv);  // OpenBLAS's best kernels for this CPU (may re-execute)
  const std::string dir = argc > 1 ? argv[1] : "ckpt";
  const int64_t steps = 20, stop = argc > 2 ? std::stoll(argv[2]) : steps, seed = 1;
  auto world = dist::init_process_group();
  auto mesh = dist::init_device_mesh({world->size()});
  nn::MiniLLMConfig cfg = nn::MiniLLMConfig::preset("tiny");
  cfg.arch = nn::Arch::llama;
  nn::MiniLLM model(cfg);
  for (size_t i = 0; i < model.layers().size(); ++i)
    fully_shard(model.layers()[i], mesh, {.seed = seed});
  FSDPModule& root = fully_shard(model, mesh, {.seed = seed});
  optim::AdamW opt(root.param_groups(0.01), {.lr = 1e-3, .weight_decay = 0.01});
  optim::LRSchedule lr(
      {.lr = 1e-3, .warmup = 5, .decay = optim::Decay::cosine, .min_lr = 1e-4, .decay_end = steps});
  data::DataLoader data(std::make_shared<data::RandomTokenSource>(cfg.vocab, seed), cfg.batch,
                        world->rank(), world->size(), cfg.seq);  // each rank's rows of cfg.batch
  // The run in dir, as fsdp-train keeps it (checkpoint::Manager): locked for this job, resumed
  // from its newest complete checkpoint (newer incomplete ones skipped aloud), the newest 2 kept.
  checkpoint::Manager ckpt({.dir = dir, .resume = true, .keep = 2}, world);
  int64_t start = 0;
  if (const auto loaded = ckpt.load(root, opt, cfg.to_json(), {"arch"})) {
    start = loaded->step;
    data.set_position(loaded->data_position);  // windows read: the next batch is the next unread
  }
  for (int64_t step = start; step < stop; ++step) {
    opt.set_lr(lr.at(step));
    model.zero_grad();
    data::Batch b = data.next();
    nn::LMLoss lm;
    Tensor loss = lm.forward(model.forward(b.inputs), b.targets);  // on the model's device
    model.backward(lm.backward());
    const double norm = optim::clip_grad_norm(root, 1.0);
    opt.step();
    world->all_reduce(loss, dist::ReduceOp::AVG)->wait();  // the mean over ranks
    if (!world->rank()) fmt::print("step {} | loss {} | norm {:.3f}\n", step, loss.item(), norm);
    if ((step + 1) % 10 == 0) ckpt.save(step + 1, root, opt, cfg.to_json(), {data.position()});
  }
  dist::destroy_process_group();
} catch (const std::exception& e) {
  fmt::print(stderr, "custom_trainer: error: {}\n", e.what());
  dist::abort_process(1);
}
