// A mixture of experts' combine and its backward (kernels/cuda/moe.cu is the mirror). Each token
// sums its k rows in f64, in choice order, and rounds once; tokens run in parallel, each
// independent of the others, so the results do not depend on the threads.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace fsdp::kernels::cpu {

template <class T>
void moe_combine(const T* rows, const int64_t* pos, const double* weight, const T* base, T* out,
                 int64_t n, int64_t k, int64_t d) {
#pragma omp parallel if (n * k * d > (1 << 15))
  {
    std::vector<double> acc(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t c = 0; c < d; ++c) acc[size_t(c)] = base ? double(base[t * d + c]) : 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t i = t * k + j;
        const double w = weight ? weight[i] : 1.0;
        const T* r = rows + pos[i] * d;
        for (int64_t c = 0; c < d; ++c) acc[size_t(c)] += w * double(r[c]);
      }
      for (int64_t c = 0; c < d; ++c) out[t * d + c] = T(acc[size_t(c)]);
    }
  }
}

template <class T>
void moe_combine_backward(const T* dout, const T* rows, const int64_t* pos, const double* weight,
                          T* drows, double* dweight, int64_t n, int64_t k, int64_t d) {
#pragma omp parallel for schedule(static) if (n * k * d > (1 << 15))
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = t * k + j;
      const double w = weight ? weight[i] : 1.0;
      const T* g = dout + t * d;
      const T* r = rows + pos[i] * d;
      T* dr = drows + pos[i] * d;
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) {
        const double gc = double(g[c]);
        dr[c] = T(w * gc);
        dot += gc * double(r[c]);
      }
      dweight[i] = dot;
    }
}

#define FSDP_MOE_KERNELS(T)                                                                     \
  template void moe_combine<T>(const T*, const int64_t*, const double*, const T*, T*, int64_t,  \
                               int64_t, int64_t);                                               \
  template void moe_combine_backward<T>(const T*, const T*, const int64_t*, const double*, T*, \
                                        double*, int64_t, int64_t, int64_t);
FSDP_MOE_KERNELS(float)
FSDP_MOE_KERNELS(double)
#undef FSDP_MOE_KERNELS

}  // namespace fsdp::kernels::cpu
