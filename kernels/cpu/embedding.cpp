// Embedding lookup and its backward. The backward scatters rows of dy into
// dw; it runs parallel over the embedding dim so that two tokens with the
// same id never race and the sum order is fixed.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/cpu_kernels.h"

namespace fsdp::kernels::cpu {

template <class T, class I>
void embedding_forward(const I* ids, const T* w, T* y, int64_t n, int64_t dim) {
#pragma omp parallel for if (n * dim > (1 << 15))
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(y + i * dim, w + int64_t(ids[i]) * dim, size_t(dim) * sizeof(T));
}

template <class T, class I>
void embedding_backward(const I* ids, const T* dy, T* dw, int64_t n, int64_t dim) {
#pragma omp parallel for if (n * dim > (1 << 15))
  for (int64_t c0 = 0; c0 < dim; c0 += 32) {
    const int64_t c1 = std::min(dim, c0 + 32);
    for (int64_t i = 0; i < n; ++i) {
      T* row = dw + int64_t(ids[i]) * dim;
      const T* g = dy + i * dim;
      for (int64_t c = c0; c < c1; ++c) row[c] += g[c];
    }
  }
}

#define FSDP_INSTANTIATE(T, I)                                                     \
  template void embedding_forward<T, I>(const I*, const T*, T*, int64_t, int64_t); \
  template void embedding_backward<T, I>(const I*, const T*, T*, int64_t, int64_t);
FSDP_INSTANTIATE(float, int32_t)
FSDP_INSTANTIATE(float, int64_t)
FSDP_INSTANTIATE(double, int32_t)
FSDP_INSTANTIATE(double, int64_t)
#undef FSDP_INSTANTIATE

}  // namespace fsdp::kernels::cpu
