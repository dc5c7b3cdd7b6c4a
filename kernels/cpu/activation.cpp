// SiLU and SwiGLU. silu(x) = x * sigmoid(x); swiglu(g, u) = silu(g) * u.
// silu'(x) = s * (1 + x * (1 - s)) with s = sigmoid(x).
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

template <class T>
void swiglu_forward(const T* gate, const T* up, T* y, int64_t n) {
#pragma omp parallel for simd if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) y[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

template <class T>
void swiglu_backward(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n) {
#pragma omp parallel for simd if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) {
    T s = sigmoid(gate[i]);
    T g = gate[i] * s;
    dup[i] = dy[i] * g;
    dgate[i] = dy[i] * up[i] * s * (T(1) + gate[i] * (T(1) - s));
  }
}

#define FSDP_INSTANTIATE(T)                                         \
  template void silu_forward<T>(const T*, T*, int64_t);             \
  template void silu_backward<T>(const T*, const T*, T*, int64_t);  \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t); \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);
FSDP_INSTANTIATE(float)
FSDP_INSTANTIATE(double)
#undef FSDP_INSTANTIATE

}  // namespace fsdp::kernels::cpu
