// RMSNorm over the last dim: y = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps).
// The forward keeps rstd per row for the backward:
//   dx = rstd * (g - xhat * mean(g * xhat)),  g = dy * w,  xhat = x * rstd
//   dw += sum over rows of dy * xhat
// dw is reduced in a second pass, parallel over columns, so it is
// deterministic at any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"

namespace fsdp::kernels::cpu {

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t dim, double eps) {
#pragma omp parallel for if (rows * dim > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < dim; ++c) ss += xr[c] * xr[c];
    T rs = T(1) / std::sqrt(ss / T(dim) + T(eps));
    rstd[r] = rs;
#pragma omp simd
    for (int64_t c = 0; c < dim; ++c) yr[c] = xr[c] * rs * w[c];
  }
}

template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw,
                      int64_t rows, int64_t dim) {
#pragma omp parallel for if (rows * dim > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    T* dxr = dx + r * dim;
    const T rs = rstd[r];
    T dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < dim; ++c) dot += dyr[c] * w[c] * xr[c];
    const T k = dot * rs * rs / T(dim);
#pragma omp simd
    for (int64_t c = 0; c < dim; ++c) dxr[c] = rs * (dyr[c] * w[c] - xr[c] * k);
  }
#pragma omp parallel for if (rows * dim > (1 << 14))
  for (int64_t c0 = 0; c0 < dim; c0 += 32) {
    const int64_t c1 = std::min(dim, c0 + 32);
    for (int64_t r = 0; r < rows; ++r) {
      const T rs = rstd[r];
      for (int64_t c = c0; c < c1; ++c) dw[c] += dy[r * dim + c] * x[r * dim + c] * rs;
    }
  }
}

#define FSDP_INSTANTIATE(T)                                                                  \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, double);    \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, \
                                    int64_t);
FSDP_INSTANTIATE(float)
FSDP_INSTANTIATE(double)
#undef FSDP_INSTANTIATE

}  // namespace fsdp::kernels::cpu
