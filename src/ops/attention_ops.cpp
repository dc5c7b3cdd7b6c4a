// Validation and dispatch of attention and the rotary embedding (the rest of the ops: ops.cpp):
// the packed qkv's dims, packed rows' document starts, sliding windows and llama3's rope scaling
// are checked here, so the kernels trust what arrives.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "fsdp/core/trace.h"
#include "fsdp/ops/ops.h"
#include "src/ops/backend.h"
#include "src/ops/cost.h"
#include "src/ops/op_checks.h"

namespace fsdp::ops {

using namespace detail;

// ---------------------------------------------------------------- attention

namespace {
struct QkvDims {
  int64_t B, T, H, KV, hd;
};
// kv_heads 0 is heads; the packed width must be (heads + 2 kv_heads) * hd.
QkvDims qkv_dims(const char* op, const Tensor& qkv, int64_t heads, int64_t kv_heads) {
  FSDP_CHECK(heads > 0, "[{}] heads must be positive, got {}", op, heads);
  if (kv_heads == 0 || kv_heads == heads) {  // multi-head: [B, T, 3d]
    FSDP_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "[{}] qkv must be [B, T, 3*dim], got {}", op,
               shape_str(qkv.shape()));
    const int64_t d = qkv.size(2) / 3;
    FSDP_CHECK(d % heads == 0, "[{}] dim {} is not divisible by heads {}", op, d, heads);
    return {qkv.size(0), qkv.size(1), heads, heads, d / heads};
  }
  const int64_t kv = kv_heads;
  FSDP_CHECK(kv > 0 && heads % kv == 0, "[{}] heads {} is not divisible by kv heads {}", op, heads,
             kv);
  FSDP_CHECK(qkv.dim() == 3 && qkv.size(2) % (heads + 2 * kv) == 0,
             "[{}] qkv must be [B, T, (heads {} + 2 * kv heads {}) * head dim], got {}", op, heads,
             kv, shape_str(qkv.shape()));
  return {qkv.size(0), qkv.size(1), heads, kv, qkv.size(2) / (heads + 2 * kv)};
}
}  // namespace

void check_doc_start(const Tensor& ds, int64_t B, int64_t T) {
  FSDP_CHECK(ds.dtype() == DType::i32 && ds.shape() == Shape({B, T}),
             "[doc_start] must be i32 [{}, {}] (the batch's rows and positions), got {} {}", B, T,
             dtype_name(ds.dtype()), shape_str(ds.shape()));
  if (!ds.device().is_cpu()) return;
  const Tensor c = ds.contiguous();
  const int32_t* p = c.data<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t v = p[b * T + t];
      FSDP_CHECK(v == t || (t > 0 && v == p[b * T + t - 1]),
                 "[doc_start] row {} position {}: {} is neither {} (a document starts there) nor "
                 "the position before's {} (documents are contiguous)",
                 b, t, v, t, t > 0 ? std::to_string(p[b * T + t - 1]) : std::string("(none)"));
    }
}

namespace {
// A packed batch's doc_start against its qkv: checked, and on the qkv's device.
void check_packed(const char* op, const Tensor& qkv, const Tensor& ds, bool causal) {
  if (!ds.defined()) return;
  FSDP_CHECK(causal, "[{}] packed rows (doc_start) need causal attention", op);
  FSDP_CHECK(ds.device() == qkv.device(), "[{}] doc_start is on {}, qkv on {}", op,
             ds.device().str(), qkv.device().str());
  check_doc_start(ds, qkv.size(0), qkv.size(1));
}
void check_window(const char* op, int64_t window, bool causal) {
  FSDP_CHECK(window >= 0, "[{}] a sliding window must be >= 0 (0: none), got {}", op, window);
  FSDP_CHECK(window == 0 || causal, "[{}] a sliding window ({}) needs causal attention", op,
             window);
}
}  // namespace

void check_rope_scaling(const RopeScaling& s, const std::string& where) {
  if (!s.enabled()) return;
  auto finite_positive = [](double v) { return std::isfinite(v) && v > 0; };
  FSDP_CHECK(std::isfinite(s.factor) && s.factor >= 1.0,
             "{}: the llama3 rope scaling factor {} must be at least 1 (0: none)", where, s.factor);
  FSDP_CHECK(finite_positive(s.low_freq_factor) && finite_positive(s.high_freq_factor) &&
                 s.low_freq_factor < s.high_freq_factor,
             "{}: the llama3 rope scaling's low_freq_factor {} and high_freq_factor {} must be "
             "positive, the low below the high",
             where, s.low_freq_factor, s.high_freq_factor);
  FSDP_CHECK(finite_positive(s.original_context),
             "{}: the llama3 rope scaling's original context {} must be positive", where,
             s.original_context);
}

std::vector<double> rope_frequencies(const Rope& rope, int64_t hd) {
  std::vector<double> f(size_t(std::max<int64_t>(hd / 2, 0)));
  for (size_t i = 0; i < f.size(); ++i) f[i] = std::pow(rope.theta, -2.0 * double(i) / double(hd));
  const RopeScaling& s = rope.scaling;
  if (!s.enabled()) return f;
  check_rope_scaling(s, "[rope]");
  const double low_wavelength = s.original_context / s.low_freq_factor,
               high_wavelength = s.original_context / s.high_freq_factor;
  for (double& x : f) {
    const double wavelength = 2.0 * std::numbers::pi / x;
    if (wavelength < high_wavelength) continue;
    if (wavelength > low_wavelength) {
      x /= s.factor;
      continue;
    }
    const double smooth = (s.original_context / wavelength - s.low_freq_factor) /
                          (s.high_freq_factor - s.low_freq_factor);
    x = (1.0 - smooth) * x / s.factor + smooth * x;
  }
  return f;
}

void rope_(const Tensor& qkv, int64_t heads, const Rope& rope, bool inverse, int64_t offset,
           int64_t kv_heads, const Tensor& doc_start) {
  FSDP_OP_SCOPE(inverse ? "rope_backward" : "rope", qkv, ({&qkv}), cost::rope_(qkv));
  const QkvDims dims = qkv_dims("rope", qkv, heads, kv_heads);
  FSDP_CHECK(dims.hd % 2 == 0, "[rope] head dim {} must be even", dims.hd);
  FSDP_CHECK(offset >= 0, "[rope] position offset must be >= 0, got {}", offset);
  FSDP_CHECK(!doc_start.defined() || offset == 0,
             "[rope] packed rows (doc_start) start each document at position 0; offset {} given",
             offset);
  check_packed("rope", qkv, doc_start, true);
  FSDP_CHECK(std::isfinite(rope.theta) && rope.theta > 0, "[rope] theta {} must be positive",
             rope.theta);
  const std::vector<double> freqs = rope_frequencies(rope, dims.hd);
  if (on_meta({&qkv}))
    return meta_impl::rope_(qkv, heads, dims.KV, freqs, inverse, offset, doc_start);
  if (on_cuda("rope", {&qkv}))
    return cuda_impl::rope_(qkv, heads, dims.KV, freqs, inverse, offset, doc_start);
  return cpu_impl::rope_(qkv, heads, dims.KV, freqs, inverse, offset, doc_start);
}

AttentionOut attention_forward(const Tensor& qkv, int64_t heads, bool causal, int64_t kv_heads,
                               const Tensor& doc_start, int64_t window) {
  FSDP_OP_SCOPE("attention", qkv, ({&qkv}), cost::attention_forward(qkv, heads, kv_heads, causal));
  const QkvDims dims = qkv_dims("attention", qkv, heads, kv_heads);
  check_packed("attention", qkv, doc_start, causal);
  check_window("attention", window, causal);
  if (on_meta({&qkv}))
    return meta_impl::attention_forward(qkv, heads, dims.KV, causal, doc_start, window);
  if (on_cuda("attention", {&qkv}))
    return cuda_impl::attention_forward(qkv, heads, dims.KV, causal, doc_start, window);
  return cpu_impl::attention_forward(qkv, heads, dims.KV, causal, doc_start, window);
}

Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int64_t heads, bool causal, int64_t kv_heads,
                          const Tensor& doc_start, int64_t window) {
  FSDP_OP_SCOPE("attention_backward", qkv, ({&dout, &qkv, &out}),
                cost::attention_backward(dout, qkv, out, heads, kv_heads, causal));
  const QkvDims dims = qkv_dims("attention_backward", qkv, heads, kv_heads);
  const int64_t B = dims.B, T_ = dims.T, H = dims.H, hd = dims.hd;
  FSDP_CHECK(dout.shape() == Shape({B, T_, H * hd}) && out.shape() == dout.shape(),
             "[attention_backward] dout {} / out {} do not match qkv {}", shape_str(dout.shape()),
             shape_str(out.shape()), shape_str(qkv.shape()));
  FSDP_CHECK(lse.numel() == B * H * T_, "[attention_backward] lse has {} elements, expected {}",
             lse.numel(), B * H * T_);
  check_packed("attention_backward", qkv, doc_start, causal);
  check_window("attention_backward", window, causal);
  if (on_meta({&dout, &qkv, &out, &lse}))
    return meta_impl::attention_backward(dout, qkv, out, lse, heads, dims.KV, causal, doc_start,
                                         window);
  if (on_cuda("attention_backward", {&dout, &qkv, &out, &lse}))
    return cuda_impl::attention_backward(dout, qkv, out, lse, heads, dims.KV, causal, doc_start,
                                         window);
  return cpu_impl::attention_backward(dout, qkv, out, lse, heads, dims.KV, causal, doc_start,
                                      window);
}

Tensor attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads,
                        int64_t past, int64_t window) {
  check_window("attention_decode", window, true);
  FSDP_OP_SCOPE("attention_decode", q, ({&q, &k, &v}), cost::attention_decode(q, k, v));
  FSDP_CHECK(q.dim() == 2 && k.dim() == 2 && v.dim() == 2 && k.shape() == v.shape(),
             "[attention_decode] q [n, heads * hd], k and v [past + n, kv heads * hd]; got {}, "
             "{}, {}",
             shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  FSDP_CHECK(past >= 0 && k.size(0) == past + q.size(0),
             "[attention_decode] k has {} positions but past {} + {} queries", k.size(0), past,
             q.size(0));
  FSDP_CHECK(heads > 0 && q.size(1) % heads == 0,
             "[attention_decode] dim {} is not divisible by "
             "heads {}",
             q.size(1), heads);
  const int64_t hd = q.size(1) / heads;
  FSDP_CHECK(hd > 0 && k.size(1) % hd == 0 && heads % (k.size(1) / hd) == 0 && k.size(1) > 0,
             "[attention_decode] k and v width {} is not a number of kv heads of dim {} that "
             "divides heads {}",
             k.size(1), hd, heads);
  const int64_t kv_heads = k.size(1) / hd;
  check_same_dtype("attention_decode", q, k, "q", "k");
  check_same_dtype("attention_decode", q, v, "q", "v");
  if (on_meta({&q, &k, &v}))
    return meta_impl::attention_decode(q, k, v, heads, kv_heads, past, window);
  if (on_cuda("attention_decode", {&q, &k, &v}))
    return cuda_impl::attention_decode(q, k, v, heads, kv_heads, past, window);
  return cpu_impl::attention_decode(q, k, v, heads, kv_heads, past, window);
}


}  // namespace fsdp::ops
