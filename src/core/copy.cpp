// Copies with a dtype cast, for any strides. The contiguous case is one flat
// parallel loop; the strided case walks the outer dims and runs the last
// dim as the inner loop.
#include "src/core/copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "src/core/dispatch.h"

namespace fsdp::detail {

namespace {

template <class D, class S>
void copy_typed(const Tensor& dst, const Tensor& src) {
  D* d = static_cast<D*>(dst.raw_data());
  const S* s = static_cast<const S*>(src.raw_data());
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.is_contiguous() && src.is_contiguous()) {
    if constexpr (std::is_same_v<D, S>) {
      std::memcpy(d, s, size_t(n) * sizeof(D));
    } else {
#pragma omp parallel for simd if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) d[i] = convert<D>(s[i]);
    }
    return;
  }
  const int nd = dst.dim();
  const Shape& shape = dst.shape();
  const int64_t inner = shape[nd - 1];
  const int64_t ds_in = dst.strides()[nd - 1], ss_in = src.strides()[nd - 1];
  const int64_t outer = n / inner;
#pragma omp parallel for if (n > (1 << 16))
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rem = o, doff = 0, soff = 0;
    for (int k = nd - 2; k >= 0; --k) {
      int64_t idx = rem % shape[k];
      rem /= shape[k];
      doff += idx * dst.strides()[k];
      soff += idx * src.strides()[k];
    }
    for (int64_t i = 0; i < inner; ++i) d[doff + i * ds_in] = convert<D>(s[soff + i * ss_in]);
  }
}

}  // namespace

void cpu_copy_cast(const Tensor& dst, const Tensor& src) {
  dispatch_all(dst.dtype(), [&](auto dv) {
    dispatch_all(src.dtype(), [&](auto sv) { copy_typed<decltype(dv), decltype(sv)>(dst, src); });
  });
}

void cpu_fill(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), [&](auto tv) {
    using T = decltype(tv);
    T v = convert<T>(value);
    T* d = static_cast<T*>(dst.raw_data());
    const int64_t n = dst.numel();
    if (dst.is_contiguous()) {
#pragma omp parallel for simd if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) d[i] = v;
      return;
    }
    // Strided fill: copy from a contiguous filled temporary.
    Tensor tmp = Tensor::empty(dst.shape(), dst.dtype());
    std::fill_n(static_cast<T*>(tmp.raw_data()), n, v);
    copy_typed<T, T>(dst, tmp);
  });
}

}  // namespace fsdp::detail
