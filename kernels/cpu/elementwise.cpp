// Elementwise kernels: residual add, bias add and its reduction, squared norm.
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"

namespace fsdp::kernels::cpu {

template <class T>
void add(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for simd if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void add_inplace(T* a, const T* b, int64_t n) {
#pragma omp parallel for simd if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

template <class T>
void bias_add_rows(T* y, const T* bias, int64_t rows, int64_t cols) {
#pragma omp parallel for if (rows * cols > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    T* yr = y + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) yr[c] += bias[c];
  }
}

template <class T>
void sum_rows_into(const T* dy, T* db, int64_t rows, int64_t cols) {
  // Parallel over columns so that each output has one writer and the sum
  // order is fixed (deterministic at any thread count).
#pragma omp parallel for if (rows * cols > (1 << 15))
  for (int64_t c0 = 0; c0 < cols; c0 += 64) {
    const int64_t c1 = std::min(cols, c0 + 64);
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = dy + r * cols;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) db[c] += row[c];
    }
  }
}

template <class T>
double sum_squares(const T* x, int64_t n) {
  double s = 0;
#pragma omp parallel for simd reduction(+ : s) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

template <class T>
void scale(T* x, T s, int64_t n) {
#pragma omp parallel for simd if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

#define FSDP_INSTANTIATE(T)                                       \
  template void scale<T>(T*, T, int64_t);                         \
  template void add<T>(const T*, const T*, T*, int64_t);          \
  template void add_inplace<T>(T*, const T*, int64_t);            \
  template void bias_add_rows<T>(T*, const T*, int64_t, int64_t); \
  template void sum_rows_into<T>(const T*, T*, int64_t, int64_t); \
  template double sum_squares<T>(const T*, int64_t);
FSDP_INSTANTIATE(float)
FSDP_INSTANTIATE(double)
#undef FSDP_INSTANTIATE

}  // namespace fsdp::kernels::cpu
