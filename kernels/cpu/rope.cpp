// Rotary position embedding on the q and k parts of a packed qkv buffer
// [B, T, H + 2 KV, hd] (H query heads, then KV key heads, then KV value heads). Pairs are
// half-split, (i, i + hd/2), with frequency freqs[i] (theta^(-2i/hd), or Llama 3's scaled ones:
// ops::rope_frequencies), the convention of Hugging Face's llama (rotate_half). The rotation is
// orthogonal, so the backward is the inverse rotation.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace fsdp::kernels::cpu {

template <class T>
void rope_qkv(T* qkv, int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t hd, const double* freqs,
              bool inverse, int64_t offset, const int32_t* doc_start) {
  const int64_t half = hd / 2, d = (H + 2 * KV) * hd;
  if (doc_start) offset = 0;  // positions t - doc_start[b, t] lie in [0, T)
  // cos/sin per (position, i), computed in double once per call.
  std::vector<T> cs(size_t(T_ * half)), sn(size_t(T_ * half));
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double ang = double(t + offset) * freqs[i];
      cs[t * half + i] = T(std::cos(ang));
      sn[t * half + i] = T(inverse ? -std::sin(ang) : std::sin(ang));
    }
#pragma omp parallel for collapse(2) if (B * T_ * d > (1 << 14))
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T_; ++t) {
      T* row = qkv + (b * T_ + t) * d;
      const int64_t pos = doc_start ? t - doc_start[b * T_ + t] : t;
      const T* c = cs.data() + pos * half;
      const T* s = sn.data() + pos * half;
      for (int64_t h = 0; h < H + KV; ++h) {  // the q heads, then the k heads (adjacent)
        T* x = row + h * hd;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          T x0 = x[i], x1 = x[i + half];
          x[i] = x0 * c[i] - x1 * s[i];
          x[i + half] = x1 * c[i] + x0 * s[i];
        }
      }
    }
}

template void rope_qkv<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, const double*,
                              bool, int64_t, const int32_t*);
template void rope_qkv<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t, const double*,
                               bool, int64_t, const int32_t*);

}  // namespace fsdp::kernels::cpu
