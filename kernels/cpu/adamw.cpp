// Fused AdamW over many flat buffers in one OpenMP region (torch's multi-tensor AdamW), with
// torch.optim.AdamW's exact order of operations (decoupled decay first, lerp for the first
// moment, bias corrections folded into the step size and the denominator).
//
// Clipping's factor is applied as each gradient is read: the scaled gradient goes through a small
// buffer on the stack, so it is rounded to T exactly as clip_scale_ rounds it in place, and
// -ffp-contract=fast (CMakeLists.txt) cannot fuse the scaling into the moments' arithmetic as an
// FMA (which would change the bits). The update's own arithmetic is the per-tensor kernel's
// expressions unchanged, so the bits are those of clip_scale_ then one adamw_ per tensor.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace fsdp::kernels::cpu {

namespace {

constexpr int64_t kChunk = 1 << 14;  // elements a thread takes at a time
constexpr int64_t kTile = 256;       // the scaled gradient's stack buffer

template <class T>
struct Consts {
  T decay, b2, one_m_b1, one_m_b2, step_size, bc2_sqrt, eps;
};

template <class T>
inline void update(T* param, const T* grad, T* m, T* v, int64_t n, const Consts<T>& c) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    T p = param[i] * c.decay;
    T mi = m[i] + c.one_m_b1 * (g - m[i]);
    T vi = v[i] * c.b2 + c.one_m_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = p - c.step_size * mi / (std::sqrt(vi) / c.bc2_sqrt + c.eps);
  }
}

}  // namespace

template <class T>
void adamw_multi(const AdamWSpan<T>* spans, int64_t count, const AdamWArgs& a, T grad_scale) {
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, double(a.step));
  std::vector<Consts<T>> consts(size_t(std::max<int64_t>(count, 0)));
  std::vector<std::pair<int64_t, int64_t>> chunks;  // (span, first element)
  int64_t total = 0;
  for (int64_t s = 0; s < count; ++s) {
    consts[size_t(s)] = {T(1.0 - a.lr * spans[s].weight_decay), T(a.beta2), T(1.0 - a.beta1),
                         T(1.0 - a.beta2), T(a.lr / bc1), T(std::sqrt(bc2)), T(a.eps)};
    for (int64_t b = 0; b < spans[s].n; b += kChunk) chunks.emplace_back(s, b);
    total += spans[s].n;
  }
  const bool scaled = grad_scale != T(1);
  const int64_t nchunks = int64_t(chunks.size());
#pragma omp parallel for schedule(static) if (total > (1 << 15))
  for (int64_t c = 0; c < nchunks; ++c) {
    const auto [s, b] = chunks[size_t(c)];
    const AdamWSpan<T>& sp = spans[s];
    const int64_t e = std::min(sp.n, b + kChunk);
    if (!scaled) {
      update(sp.param + b, sp.grad + b, sp.m + b, sp.v + b, e - b, consts[size_t(s)]);
      continue;
    }
    alignas(64) T tile[kTile];
    for (int64_t t = b; t < e; t += kTile) {
      const int64_t len = std::min(kTile, e - t);
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) tile[i] = sp.grad[t + i] * grad_scale;
      update(sp.param + t, tile, sp.m + t, sp.v + t, len, consts[size_t(s)]);
    }
  }
}

template void adamw_multi<float>(const AdamWSpan<float>*, int64_t, const AdamWArgs&, float);
template void adamw_multi<double>(const AdamWSpan<double>*, int64_t, const AdamWArgs&, double);

}  // namespace fsdp::kernels::cpu
