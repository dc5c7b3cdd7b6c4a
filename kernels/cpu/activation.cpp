// SiLU, SwiGLU and GeGLU. silu(x) = x * sigmoid(x); swiglu(g, u) = silu(g) * u.
// silu'(x) = s * (1 + x * (1 - s)) with s = sigmoid(x).
// gelu(x) = 0.5 x (1 + t), t = tanh(k (x + c x^3)), k = sqrt(2 / pi), c = 0.044715 (the tanh
// form); gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2); geglu(g, u) = gelu(g) * u.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vec_math.h"

namespace fsdp::kernels::cpu {

template <class T>
static inline T sigmoid(T x) {
  return T(1) / (T(1) + vexp(-x));
}

template <class T>
void silu_forward(const T* x, T* y, int64_t n) {
#pragma omp parallel for simd if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(x[i]);
}

template <class T>
void silu_backward(const T* dy, const T* x, T* dx, int64_t n) {
#pragma omp parallel for simd if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) {
    T s = sigmoid(x[i]);
    dx[i] = dy[i] * s * (T(1) + x[i] * (T(1) - s));
  }
}

constexpr double kGeluK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluC = 0.044715;

template <class T>
void swiglu_forward(const T* gate, const T* up, T* y, int64_t n, bool gelu) {
  if (gelu) {
#pragma omp parallel for if (n > (1 << 14))
    for (int64_t i = 0; i < n; ++i) {
      const T x = gate[i], t = std::tanh(T(kGeluK) * (x + T(kGeluC) * x * x * x));
      y[i] = T(0.5) * x * (T(1) + t) * up[i];
    }
    return;
  }
#pragma omp parallel for simd if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) y[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

template <class T>
void swiglu_backward(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n,
                     bool gelu) {
  if (gelu) {
#pragma omp parallel for if (n > (1 << 14))
    for (int64_t i = 0; i < n; ++i) {
      const T x = gate[i], t = std::tanh(T(kGeluK) * (x + T(kGeluC) * x * x * x));
      dup[i] = dy[i] * T(0.5) * x * (T(1) + t);
      dgate[i] = dy[i] * up[i] *
                 (T(0.5) * (T(1) + t) +
                  T(0.5) * x * (T(1) - t * t) * T(kGeluK) * (T(1) + T(3 * kGeluC) * x * x));
    }
    return;
  }
#pragma omp parallel for simd if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) {
    T s = sigmoid(gate[i]);
    T g = gate[i] * s;
    dup[i] = dy[i] * g;
    dgate[i] = dy[i] * up[i] * s * (T(1) + gate[i] * (T(1) - s));
  }
}

#define FSDP_INSTANTIATE(T)                                               \
  template void silu_forward<T>(const T*, T*, int64_t);                   \
  template void silu_backward<T>(const T*, const T*, T*, int64_t);        \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t, bool); \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, bool);
FSDP_INSTANTIATE(float)
FSDP_INSTANTIATE(double)
#undef FSDP_INSTANTIATE

}  // namespace fsdp::kernels::cpu
