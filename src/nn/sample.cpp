// Temperature and top-k sampling from a MiniLLM.
#include "fsdp/nn/sample.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/nn/init.h"

namespace fsdp::nn {

std::vector<int32_t> sample(MiniLLM& model, std::vector<int32_t> ctx, const SampleOptions& o) {
  const MiniLLMConfig& c = model.config();
  FSDP_CHECK(o.tokens >= 0 && o.temperature >= 0 && o.top_k >= 0 && o.max_id >= 0,
             "[sample] tokens {}, temperature {}, top_k {} and max_id {} must be >= 0", o.tokens,
             o.temperature, o.top_k, o.max_id);
  for (int32_t id : ctx)
    FSDP_CHECK(id >= 0 && id < c.vocab, "[sample] context id {} is outside the vocab [0, {})", id,
               c.vocab);
  if (ctx.empty()) ctx.push_back(int32_t(' ') % int32_t(c.vocab));
  const int64_t v = o.max_id > 0 ? std::min(o.max_id, c.vocab) : c.vocab;
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, v) : v;
  std::vector<int32_t> out;
  std::vector<int64_t> idx(static_cast<size_t>(v));
  std::vector<double> p(static_cast<size_t>(k));
  for (int64_t i = 0; i < o.tokens; ++i) {
    const int64_t len = std::min<int64_t>(int64_t(ctx.size()), c.seq);
    std::vector<int32_t> window(ctx.end() - len, ctx.end());
    Tensor logits = model.forward(Tensor::from_vector(window, {1, len}).to(o.device))
                        .to(Device::cpu())
                        .to(DType::f64);
    const double* last = logits.data<double>() + (len - 1) * c.vocab;
    for (int64_t j = 0; j < v; ++j) idx[size_t(j)] = j;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int64_t a, int64_t b) { return last[a] > last[b]; });
    int64_t pick = idx[0];
    if (o.temperature > 0) {
      double sum = 0;
      for (int64_t j = 0; j < k; ++j)
        sum += p[size_t(j)] = std::exp((last[idx[size_t(j)]] - last[idx[0]]) / o.temperature);
      double u = counter_uniform(o.seed, uint64_t(i)) * sum;
      for (int64_t j = 0; j < k; ++j) {
        pick = idx[size_t(j)];
        if ((u -= p[size_t(j)]) <= 0) break;
      }
    }
    ctx.push_back(int32_t(pick));
    out.push_back(int32_t(pick));
  }
  return out;
}

}  // namespace fsdp::nn
