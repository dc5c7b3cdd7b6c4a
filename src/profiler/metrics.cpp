// A training step's numbers, agreed across ranks.
#include "fsdp/profiler/metrics.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "fsdp/core/allocator.h"
#include "fsdp/core/tensor.h"

namespace fsdp::profiler {

std::string StepMetrics::line() const {
  return fmt::format(
      "step {} | loss {:.4f} | {:.0f} tok/s | mfu {:.1f}% | peak mem {:.2f} GB | lr {:.1e} | "
      "grad norm {:.3f}",
      step, loss, tokens_per_s, 100.0 * mfu, peak_mem_bytes / 1e9, lr, grad_norm);
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
  if (val_loss) j["val_loss"] = *val_loss;
  return j.dump();
}

StepMetrics gather_step_metrics(dist::ProcessGroup& group, Device device, const StepInputs& in) {
  const int n = group.size();
  Tensor mine =
      Tensor::from_vector<double>({in.loss, double(memory_stats(device).peak)}, {2}).to(device);
  Tensor all = Tensor::empty({2 * int64_t(n)}, DType::f64, device);
  group.all_gather_into_tensor(all, mine)->wait();
  const std::vector<double> v = all.to(Device::cpu()).to_f64_vector();
  StepMetrics m;
  m.step = in.step, m.grad_norm = in.grad_norm, m.lr = in.lr, m.step_seconds = in.step_seconds;
  for (int r = 0; r < n; ++r) {
    m.loss += v[size_t(2 * r)] / n;
    m.peak_mem_bytes = std::max(m.peak_mem_bytes, v[size_t(2 * r + 1)]);
  }
  m.tokens_per_s = in.step_seconds > 0 ? double(in.tokens) / in.step_seconds : 0;
  m.mfu = in.peak_flops > 0 ? in.flops_per_token * m.tokens_per_s / in.peak_flops : 0;
  return m;
}

}  // namespace fsdp::profiler
