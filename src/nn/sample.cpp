// Temperature, top-k and top-p sampling from a Transformer, with a KV cache for the decoder form.
#include "fsdp/nn/sample.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>

#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/nn/init.h"

namespace fsdp::nn {

namespace {

// Picks an id from the logits row `last` (over ids [0, v)).
int32_t pick(const double* last, int64_t v, const SampleOptions& o, int64_t draw,
             std::vector<int64_t>& idx, std::vector<double>& p) {
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, v) : v;
  idx.resize(size_t(v));
  for (int64_t j = 0; j < v; ++j) idx[size_t(j)] = j;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int64_t a, int64_t b) { return last[a] > last[b]; });
  if (o.temperature <= 0) return int32_t(idx[0]);
  p.resize(size_t(k));
  double sum = 0;
  for (int64_t j = 0; j < k; ++j)
    sum += p[size_t(j)] = std::exp((last[idx[size_t(j)]] - last[idx[0]]) / o.temperature);
  int64_t keep = k;
  if (o.top_p < 1.0) {  // the smallest prefix whose probability reaches top_p
    double acc = 0;
    for (int64_t j = 0; j < k; ++j) {
      acc += p[size_t(j)] / sum;
      if (acc >= o.top_p) {
        keep = j + 1;
        break;
      }
    }
    sum = 0;
    for (int64_t j = 0; j < keep; ++j) sum += p[size_t(j)];
  }
  double u = counter_uniform(o.seed, uint64_t(draw)) * sum;
  for (int64_t j = 0; j < keep; ++j)
    if ((u -= p[size_t(j)]) <= 0) return int32_t(idx[size_t(j)]);
  return int32_t(idx[size_t(keep - 1)]);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::vector<int32_t> sample(Transformer& model, std::vector<int32_t> ctx, const SampleOptions& o,
                            SampleStats* stats) {
  const TransformerConfig& c = model.config();
  FSDP_CHECK(o.tokens >= 0 && o.temperature >= 0 && o.top_k >= 0 && o.max_id >= 0,
             "[sample] tokens {}, temperature {}, top_k {} and max_id {} must be >= 0", o.tokens,
             o.temperature, o.top_k, o.max_id);
  FSDP_CHECK(o.top_p > 0 && o.top_p <= 1, "[sample] top_p must be in (0, 1], got {}", o.top_p);
  for (int32_t id : ctx)
    FSDP_CHECK(id >= 0 && id < c.vocab, "[sample] context id {} is outside the vocab [0, {})", id,
               c.vocab);
  if (ctx.empty()) ctx.push_back(int32_t(' ') % int32_t(c.vocab));
  const int64_t v = o.max_id > 0 ? std::min(o.max_id, c.vocab) : c.vocab;
  const bool cached = o.kv_cache && c.arch == Arch::decoder;
  SampleStats st;
  st.prompt_tokens = int64_t(ctx.size());
  std::vector<int32_t> out;
  std::vector<int64_t> idx;
  std::vector<double> p;
  // The logits of the last position of `ids`, on the host.
  auto run = [&](const std::vector<int32_t>& ids) {
    const auto len = int64_t(ids.size());
    Tensor logits = model.forward(Tensor::from_vector(ids, {1, len}).to(o.device));
    return logits.view({len, c.vocab}).slice(len - 1, len).to(Device::cpu()).to(DType::f64);
  };
  auto window = [&](int64_t len) {
    len = std::min<int64_t>(int64_t(ctx.size()), len);
    return std::vector<int32_t>(ctx.end() - len, ctx.end());
  };
  auto t0 = std::chrono::steady_clock::now();
  Tensor last;
  if (cached) {
    model.start_kv_cache(c.seq);
    last = run(window(c.seq));
  }
  st.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.tokens; ++i) {
    if (!cached) last = run(window(c.seq));
    const int32_t id = pick(last.data<double>(), v, o, i, idx, p);
    ctx.push_back(id);
    out.push_back(id);
    if (o.on_token) o.on_token(id);
    if ((o.stop_id && id == *o.stop_id) || i + 1 == o.tokens) break;
    if (cached) {
      if (model.kv_length() >= c.seq) {  // full: keep the last half (at least a token), refill
        model.start_kv_cache(c.seq);
        last = run(window(std::max<int64_t>(1, c.seq / 2)));
      } else {
        last = run({id});
      }
    }
  }
  if (cached) model.stop_kv_cache();
  st.new_tokens = int64_t(out.size());
  st.decode_seconds = seconds_since(t0);
  if (stats) *stats = st;
  return out;
}

}  // namespace fsdp::nn
