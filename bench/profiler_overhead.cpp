// fsdp-bench-profiler: what the profiler costs. With the profiler off, each
// op pays for one trace::Scope that finds recording inactive (an atomic load
// and a branch): timed here over many empty scopes, and set against the
// cheapest real op (a 1024-element add) and a tiny-preset training step.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fsdp/core/trace.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/ops/ops.h"
#include "fsdp/profiler/profiler.h"

using namespace fsdp;
using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int main() {
  const int64_t n = 200'000'000;
  auto t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) {
    trace::Scope s("off");
    asm volatile("" ::: "memory");
  }
  const double off_ns = seconds_since(t0) / double(n) * 1e9;

  Tensor a = Tensor::full({1024}, 1.0, DType::f32);
  const int reps = 200000;
  t0 = Clock::now();
  for (int i = 0; i < reps; ++i) ops::add_(a, a);
  const double add_ns = seconds_since(t0) / reps * 1e9;

  nn::TransformerConfig c = nn::TransformerConfig::preset("tiny");
  nn::Transformer model(c);
  auto flat = nn::materialize(model, DType::f32, 1);
  std::vector<int32_t> ids(size_t(c.batch * c.seq));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 7 % c.vocab);
  Tensor tok = Tensor::from_vector(ids, {c.batch, c.seq}),
         tgt = Tensor::from_vector(ids, {c.batch * c.seq});
  auto step = [&] {
    flat.grads.zero_();
    Tensor logits = model.forward(tok).view({c.batch * c.seq, c.vocab});
    auto x = ops::cross_entropy_forward(logits, tgt);
    model.backward(ops::cross_entropy_backward(logits, tgt, x.lse).view({c.batch, c.seq, c.vocab}));
  };
  step();
  double best_off = 1e30, best_on = 1e30;
  size_t ops_per_step = 0;
  for (int r = 0; r < 3; ++r) {
    t0 = Clock::now();
    step();
    best_off = std::min(best_off, seconds_since(t0));
    profiler::Profiler prof({.record_shapes = true, .profile_memory = true});
    prof.start();
    t0 = Clock::now();
    step();
    best_on = std::min(best_on, seconds_since(t0));
    prof.stop();
    ops_per_step = prof.records().size();
  }
  fmt::print(
      "profiler off: {:.2f} ns per op (one inactive trace::Scope), {:.3f}% of a 1024-element add "
      "({:.0f} ns)\n",
      off_ns, 100.0 * off_ns / add_ns, add_ns);
  fmt::print(
      "tiny-preset forward+backward: {:.1f} ms off, {:.1f} ms on ({} records: shapes and memory), "
      "{:+.2f}% when on; off costs {} x {:.2f} ns = {:.4f}% of the step\n",
      best_off * 1e3, best_on * 1e3, ops_per_step, 100.0 * (best_on / best_off - 1), ops_per_step,
      off_ns, 100.0 * double(ops_per_step) * off_ns * 1e-9 / best_off);
  return 0;
}
