// A training step's numbers, agreed across ranks.
#include "fsdp/profiler/metrics.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fsdp/core/allocator.h"
#include "fsdp/core/tensor.h"

namespace fsdp::profiler {

std::string short_duration(double seconds) {
  const auto s = int64_t(std::llround(std::max(0.0, seconds)));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
}

std::string StepMetrics::line() const {
  std::string out = fmt::format(
      "step {} | loss {:.4f} | {:.0f} tok/s | mfu {:.1f}% | peak mem {:.2f} GB | lr {:.1e} | "
      "grad norm {:.3f}",
      step, loss, tokens_per_s, 100.0 * mfu, peak_mem_bytes / 1e9, lr, grad_norm);
  if (targets == 0)
    out += " | no targets (all masked): optimizer not stepped";
  else if (targets > 0)
    out += fmt::format(" | {} targets", targets);
  for (const auto& [name, v] : named) out += fmt::format(" | {} {:.4f}", name, v);
  if (elapsed_seconds >= 0) out += fmt::format(" | elapsed {}", short_duration(elapsed_seconds));
  if (eta_seconds >= 0) out += fmt::format(" | eta {}", short_duration(eta_seconds));
  return out;
}

std::string StepMetrics::json() const {
  nlohmann::json j{{"step", step},
                   {"loss", loss},
                   {"lr", lr},
                   {"grad_norm", grad_norm},
                   {"tok_s", tokens_per_s},
                   {"mfu", mfu},
                   {"peak_mem_gb", peak_mem_bytes / 1e9},
                   {"step_ms", step_seconds * 1e3}};
  if (elapsed_seconds >= 0) j["elapsed_s"] = elapsed_seconds;
  if (val_loss) j["val_loss"] = *val_loss;
  if (host_syncs >= 0) j["host_syncs"] = host_syncs;
  if (targets >= 0) j["targets"] = targets;
  if (all_gather_bytes > 0) j["all_gather_bytes"] = all_gather_bytes;
  for (const auto& [name, v] : named) j[name] = v;
  return j.dump();
}

StepMetrics gather_step_metrics(dist::ProcessGroup& group, Device device, const StepInputs& in) {
  const int n = group.size();
  // Per rank: [losses..., grad norm squared, peak memory, stop, checkpoint writer]. Built on the
  // device with copies and fills queued on its stream (no host-to-device transfer), read back once.
  // A microbatch's loss may come in parts (a chunked loss's f64 [chunks]): its sum.
  int64_t nl = 0;
  for (const Tensor& l : in.losses) nl += l.numel();
  nl = std::max<int64_t>(1, nl);
  const int64_t nm = int64_t(in.metric_names.size()), nmv = nm * int64_t(in.metrics.size());
  const int64_t k = nl + 4 + nmv;  // the named metrics last, microbatch by microbatch
  Tensor mine = Tensor::empty({k}, DType::f64, device);
  if (in.losses.empty())
    mine.narrow(0, 0, 1).fill_(in.loss);
  for (int64_t i = 0, at = 0; i < int64_t(in.losses.size());
       at += in.losses[size_t(i)].numel(), ++i)
    mine.narrow(0, at, in.losses[size_t(i)].numel())
        .copy_(in.losses[size_t(i)].reshape({in.losses[size_t(i)].numel()}));
  if (in.grad_norm_sq.defined())
    mine.narrow(0, nl, 1).copy_(in.grad_norm_sq.reshape({1}));
  else
    mine.narrow(0, nl, 1).fill_(in.grad_norm * in.grad_norm);
  mine.narrow(0, nl + 1, 1).fill_(double(memory_stats(device).peak));
  mine.narrow(0, nl + 2, 1).fill_(in.stop ? 1.0 : 0.0);
  mine.narrow(0, nl + 3, 1).fill_(double(in.ckpt_write));
  for (size_t i = 0; i < in.metrics.size(); ++i)
    mine.narrow(0, nl + 4 + int64_t(i) * nm, nm).copy_(in.metrics[i].reshape({nm}));
  Tensor all = Tensor::empty({k * int64_t(n)}, DType::f64, device);
  group.all_gather_into_tensor(all, mine)->wait();
  const std::vector<double> v = all.to(Device::cpu()).to_f64_vector();
  StepMetrics m;
  m.step = in.step, m.lr = in.lr, m.step_seconds = in.step_seconds;
  const size_t me = size_t(group.rank() * k);
  m.grad_norm = in.grad_norm_sq.defined() ? std::sqrt(v[me + size_t(nl)]) : in.grad_norm;
  for (int r = 0; r < n; ++r) {
    const size_t at = size_t(r * k);
    double loss = in.losses.empty() ? v[at] : 0.0;
    if (!in.losses.empty())  // the mean over microbatches of each one's sum of parts
      for (int64_t i = 0; i < nl; ++i) loss += v[at + size_t(i)] / double(in.losses.size());
    m.loss += loss / n;
    m.peak_mem_bytes = std::max(m.peak_mem_bytes, v[at + size_t(nl) + 1]);
    m.stop = m.stop || v[at + size_t(nl) + 2] != 0;
    m.ckpt_writing = m.ckpt_writing || v[at + size_t(nl) + 3] == 1;
    m.ckpt_write_failed = m.ckpt_write_failed || v[at + size_t(nl) + 3] == 3;
  }
  for (int64_t j = 0; j < nm && !in.metrics.empty(); ++j) {  // the mean over ranks and microbatches
    double sum = 0;
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < int64_t(in.metrics.size()); ++i)
        sum += v[size_t(r * k + nl + 4 + i * nm + j)];
    m.named.emplace_back(in.metric_names[size_t(j)], sum / double(n * int64_t(in.metrics.size())));
  }
  m.tokens_per_s = in.step_seconds > 0 ? double(in.tokens) / in.step_seconds : 0;
  m.mfu = in.peak_flops > 0 ? in.flops_per_token * m.tokens_per_s / in.peak_flops : 0;
  return m;
}

}  // namespace fsdp::profiler
