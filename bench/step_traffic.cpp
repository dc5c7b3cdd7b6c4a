// fsdp-bench-traffic: the tail of a step on the CPU that issue 54's traffic changes rewrote, before
// against after, interleaved in one process over the same buffers: a model's sharded gradients
// (one flat group per block and one for the rest, as fully_shard makes them at one rank) receive
// the step's reduced gradient, are clipped by the global norm, and AdamW steps.
//   before: zero_grad's zeroing pass, the reduced gradient added to the zeros, the norm's read,
//           clip_scale_'s read and write, and one AdamW call per group (an OpenMP region each);
//   after:  the reduced gradient written (one copy), the norm's read, and one multi-tensor AdamW
//           pass that scales each gradient as it reads it.
// Both run this build's kernels (adamw_ is adamw_multi_ of one tensor): what is measured is the
// passes and regions, not a kernel's code. The parameters after the steps must be equal bit for
// bit; the time is the median of the rounds, each side's best of 3 steps a round.
//   fsdp-bench-traffic [preset] [rounds]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fsdp/core/tensor.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/clip.h"

using namespace fsdp;
using Clock = std::chrono::steady_clock;

namespace {

struct Side {
  std::vector<nn::ParamGroup> groups;
  std::vector<Tensor> reduced;  // what the reduce-scatter hands over
  optim::AdamW opt;
  Side(const std::vector<int64_t>& sizes, const std::vector<Tensor>& r)
      : groups(make(sizes)), reduced(r), opt(groups, {.lr = 1e-3}) {}
  static std::vector<nn::ParamGroup> make(const std::vector<int64_t>& sizes) {
    std::vector<nn::ParamGroup> g;
    for (int64_t n : sizes)
      g.push_back({Tensor::full({n}, 0.01, DType::f32), Tensor::zeros({n}, DType::f32), 0.1});
    return g;
  }
};

// zero_grad, the reduced gradient added to the zeros, the norm and clip_scale_.
void before_clip(Side& s, double max_norm) {
  for (size_t i = 0; i < s.groups.size(); ++i) {
    s.groups[i].grads.zero_();
    ops::add_(s.groups[i].grads, s.reduced[i]);
  }
  optim::clip_grad_norm_async(s.groups, max_norm, nullptr);  // read, then read and write
}

void after(Side& s, double max_norm) {
  for (size_t i = 0; i < s.groups.size(); ++i) s.groups[i].grads.copy_(s.reduced[i]);
  const optim::GradNorm norm = optim::clip_grad_norm_async(s.groups, 0, nullptr);
  s.opt.step_clipped({.total_sq = norm.total_sq, .max_norm = max_norm});
}

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "tiny";
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 15;
  nn::TransformerConfig c = nn::TransformerConfig::preset(preset);
  nn::Transformer model(c);
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (auto& [name, p] : model.named_parameters()) total += shape_numel(p->shape);
  int64_t in_blocks = 0;
  for (size_t i = 0; i < model.layers().size(); ++i) {
    int64_t n = 0;
    for (auto& [name, p] : model.layers()[i].named_parameters()) n += shape_numel(p->shape);
    sizes.push_back(n);
    in_blocks += n;
  }
  sizes.push_back(total - in_blocks);  // embeddings, final norm, head: the root's group
  std::vector<Tensor> reduced;
  for (int64_t n : sizes) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float((i * 7919) % 2001 - 1000) * 1e-3f;
    reduced.push_back(Tensor::from_vector(v, {n}));
  }
  const double max_norm = 1.0;  // the gradients' norm is far above it: the clipping acts
  Side b(sizes, reduced), a(sizes, reduced);
  // before's AdamW: one adamw_ per group, as AdamW::step was.
  auto step_before = [&] {
    before_clip(b, max_norm);
    for (size_t i = 0; i < b.groups.size(); ++i)
      ops::adamw_(b.groups[i].params, b.groups[i].grads, b.opt.exp_avg(i), b.opt.exp_avg_sq(i),
                  {.lr = 1e-3, .weight_decay = 0.1}, b.opt.step_count() + 1);
    b.opt.set_step_count(b.opt.step_count() + 1);
  };
  auto step_after = [&] { after(a, max_norm); };
  std::vector<double> tb, ta;
  for (int r = 0; r < rounds; ++r) {
    double best_b = 1e30, best_a = 1e30;
    for (int k = 0; k < 3; ++k) {
      auto t0 = Clock::now();
      step_before();
      best_b = std::min(best_b, std::chrono::duration<double>(Clock::now() - t0).count());
      t0 = Clock::now();
      step_after();
      best_a = std::min(best_a, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    tb.push_back(best_b);
    ta.push_back(best_a);
  }
  bool same = true;
  for (size_t i = 0; i < sizes.size(); ++i)
    same = same && a.groups[i].params.to_f64_vector() == b.groups[i].params.to_f64_vector() &&
           a.opt.exp_avg_sq(i).to_f64_vector() == b.opt.exp_avg_sq(i).to_f64_vector();
  std::sort(tb.begin(), tb.end());
  std::sort(ta.begin(), ta.end());
  const double mb = tb[tb.size() / 2] * 1e3, ma = ta[ta.size() / 2] * 1e3;
  fmt::print("| {} ({} groups, {:.2f} M f32 parameters) | {:.2f} | {:.2f} | {:.2f} | {} after {} "
             "steps |\n",
             preset, sizes.size(), double(total) / 1e6, mb, ma, mb / ma,
             same ? "identical" : "DIFFER", 3 * rounds);
  return same ? 0 : 1;
}
