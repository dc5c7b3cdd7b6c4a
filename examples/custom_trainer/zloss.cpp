// A loss of the trainer's own, passed to the library's step: cross-entropy plus PaLM's z-loss,
// 1e-4 * logsumexp(logits)^2 averaged over the targets, which keeps the softmax's normaliser near
// 1. The model is a bigram language model made from nn modules (an embedding, then a head) and
// fully_shard; train_step runs it with the loss in StepParts::loss, and the memory plan, given
// the same loss and the same way of making the model, plans its buffers.
//
//   mpirun -np 2 custom_trainer_zloss [STEPS]
//
// Prints the plan ("plan | ...") and each step's loss to every digit ("step N | loss L").
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/layers.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/train/memory_plan.h"
#include "fsdp/train/step.h"
using namespace fsdp;

namespace {

constexpr int64_t kVocab = 64, kDim = 16, kSeq = 16, kBatch = 8;  // kBatch: the global rows
constexpr double kZ = 1e-4;                                       // PaLM's z-loss weight

// Cross-entropy (the library's, over the logits) plus kZ * lse^2 summed over the targets and
// divided as the cross-entropy is. Its own buffer is d(z-loss)/d(logits), [rows, vocab] in f32,
// made in the forward (before the cross-entropy's backward overwrites the logits) and added to
// the cross-entropy's dlogits in the backward. The z-term's math runs on the host: CPU runs (on
// the meta device, where the memory plan runs it, only its buffers are made).
class ZLoss final : public train::Loss {
 public:
  Tensor forward(const Tensor& logits, const Tensor& targets, const train::LossArgs& a) override {
    const Tensor ce = ce_.forward(logits, targets, a);  // f64 [1], on the device
    const int64_t rows = targets.numel(), vocab = logits.size(logits.dim() - 1);
    const Device device = logits.device();
    FSDP_CHECK(device.is_cpu() || device.is_meta(), "[zloss] the z-term runs on the host: {}",
               device.str());
    dz_ = Tensor::empty({rows, vocab}, DType::f32, device);
    Tensor out = Tensor::empty({2}, DType::f64, device);  // {cross-entropy, z-loss}: their sum
    out.narrow(0, 0, 1).copy_(ce.reshape({1}));
    double z = 0;
    if (device.is_cpu()) {
      const Tensor l = logits.contiguous().to(DType::f32);
      const float* x = l.data<float>();
      const Tensor tc = targets.contiguous();
      const int32_t* t = tc.data<int32_t>();
      float* g = dz_.data<float>();
      const double divisor = a.divisor > 0 ? a.divisor : double(rows);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = x + r * vocab;
        double max = row[0], sum = 0;
        for (int64_t v = 1; v < vocab; ++v) max = std::max(max, double(row[v]));
        for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - max);
        const double lse = max + std::log(sum);
        const bool target = t[r] != int32_t(kIgnoreIndex);
        if (target) z += kZ * lse * lse / divisor;
        // d(kZ lse^2 / divisor)/d(logit v) = 2 kZ lse softmax(v) / divisor, times d(step)/d(loss)
        const double k = target ? 2.0 * kZ * lse / divisor * a.scale : 0.0;
        for (int64_t v = 0; v < vocab; ++v)
          g[r * vocab + v] = float(k * std::exp(double(row[v]) - lse));
      }
    }
    out.narrow(0, 1, 1).copy_(Tensor::full({1}, z, DType::f64));
    return out;
  }
  Tensor backward() override {
    Tensor d = ce_.backward();  // the cross-entropy's dlogits, written over the logits
    ops::add_(d, dz_.view(d.shape()));
    dz_ = Tensor();
    return d;
  }
  std::string describe() const override { return "cross-entropy + z-loss 1e-4 lse^2"; }

 private:
  train::CrossEntropy ce_{/*fused=*/false};  // the z-term needs the logits
  Tensor dz_;
};

// The bigram model: logits = head(embed(tokens)), sharded by fully_shard at the root. The same
// function makes it for training and for the memory plan (on the plan's meta mesh).
train::PlannedModel bigram(std::shared_ptr<dist::DeviceMesh> mesh, const FullyShardOptions& o) {
  auto model = std::make_unique<nn::ModuleList>();
  model->append(std::make_unique<nn::Embedding>(kVocab, kDim));
  model->append(std::make_unique<nn::Linear>(kDim, kVocab, /*bias=*/false));
  DataParallelModule* root = &fully_shard(*model, std::move(mesh), o);
  return {std::move(model), root};
}

}  // namespace

int main(int argc, char** argv) try {
  auto world = dist::init_process_group();
  const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 8;
  ZLoss loss;
  const auto make_adamw = [](std::vector<nn::ParamGroup> groups) {
    return std::make_unique<optim::AdamW>(std::move(groups),
                                          ops::AdamWHyper{.lr = 1e-2, .weight_decay = 0.0});
  };
  // The plan of what this rank will hold: the same model, optimizer and loss, on the meta device.
  nn::TransformerConfig shape = nn::TransformerConfig::preset("tiny");
  shape.vocab = kVocab, shape.seq = kSeq, shape.batch = kBatch / world->size();
  const train::MemoryPlan plan = train::plan_memory(
      {.model = shape,
       .build = bigram,
       .shards = world->size(),
       .loss = &loss,
       .optimizer = [&](std::vector<nn::ParamGroup> g) { return make_adamw(std::move(g)); }});
  if (world->rank() == 0) {
    fmt::print("plan | peak {} bytes allocated at {}\n", plan.peak_allocated, plan.at);
    for (const train::MemoryTerm& t : plan.terms)
      fmt::print("plan | {}: {} bytes ({})\n", t.name, t.bytes, t.what);
    fmt::print("plan | loss {}: {} bytes of its own\n", plan.loss, plan.loss_bytes);
  }
  train::PlannedModel model =
      bigram(dist::init_device_mesh({world->size()}, {"shard"}), {.seed = 1});
  const auto opt = make_adamw(model.parallel->param_groups(0.0));
  data::DataLoader data(std::make_shared<data::RandomTokenSource>(kVocab, 1), kBatch,
                        world->rank(), world->size(), kSeq);
  const train::StepParts parts{.model = *model.model,
                               .parallel = *model.parallel,
                               .optimizer = *opt,
                               .loader = data,
                               .group = *world,
                               .loss = &loss};
  for (int64_t s = 0; s < steps; ++s) {
    const profiler::StepMetrics m = train::train_step(parts, s, {.grad_clip = 1.0});
    if (world->rank() == 0) fmt::print("step {} | loss {:.17g}\n", s, m.loss);
  }
  dist::destroy_process_group();
} catch (const std::exception& e) {
  dist::abort_process(e, "custom_trainer_zloss");
}
