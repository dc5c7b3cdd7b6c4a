// exp that the compiler can vectorise. glibc's expf is a scalar call, and the
// softmaxes and sigmoids of a training step make tens of millions of them.
// For float this is the Cephes expf (Cody-Waite reduction by ln 2, a degree-6
// polynomial, the exponent put in by bit arithmetic): relative error under
// 2e-7, exactly 0 below -87.3 (where expf underflows to subnormals) and
// clamped at 88.3. Doubles keep std::exp: the f64 path is the reference the
// gradient checks rely on.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace fsdp::kernels::cpu {

#pragma omp declare simd
inline float exp_f32(float x) {
  const float hi = 88.3762626647949f, lo = -87.3365447504f;
  const bool under = x < lo;
  x = x > hi ? hi : (under ? lo : x);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick; its low bits are n itself.
  const float t = x * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t e = (std::bit_cast<int32_t>(t) - 0x4B400000) + 127;
  const float scale = std::bit_cast<float>(e << 23);
  return under ? 0.0f : y * scale;
}

template <class T>
inline T vexp(T x) {
  if constexpr (sizeof(T) == 4) {
    return exp_f32(x);
  } else {
    return std::exp(x);
  }
}

}  // namespace fsdp::kernels::cpu
