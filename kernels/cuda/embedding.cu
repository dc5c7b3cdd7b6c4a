// Embedding lookup (one block per token) and its scatter-add backward
// (atomic adds; tokens that repeat add in an unspecified order).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

template <class T, class I>
__global__ void embedding_fwd(const I* __restrict__ ids, const T* __restrict__ w, T* __restrict__ y,
                              int64_t vocab, int64_t dim) {
  const int64_t row = blockIdx.x, id = int64_t(ids[row]);
  T* dst = y + row * dim;
  if (id < 0 ||
      id >= vocab) {  // ids are not checked on the host (that would sync): poison the row instead
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = from_f32<T>(NAN);
    return;
  }
  const T* src = w + id * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = src[c];
}

template <class T, class G, class I>
__global__ void embedding_bwd(const I* __restrict__ ids, const T* __restrict__ dy,
                              G* __restrict__ dw, int64_t vocab, int64_t dim) {
  const int64_t row = blockIdx.x, id = int64_t(ids[row]);
  if (id < 0 || id >= vocab) return;
  G* dst = dw + id * dim;
  const T* src = dy + row * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) atomic_add(dst + c, to_f32(src[c]));
}

void embedding_forward(const void* ids, DType idt, const void* w, void* y, DType t, int64_t n,
                       int64_t vocab, int64_t dim, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_index(idt, "embedding", [&](auto iv) {
    using I = decltype(iv);
    dispatch_float(t, "embedding", [&](auto tv) {
      using T = decltype(tv);
      embedding_fwd<T, I><<<unsigned(n), 256, 0, cudaStream_t(s)>>>(
          static_cast<const I*>(ids), static_cast<const T*>(w), static_cast<T*>(y), vocab, dim);
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

void embedding_backward(const void* ids, DType idt, const void* dy, DType t, void* dw, DType dwt,
                        int64_t n, int64_t vocab, int64_t dim, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_index(idt, "embedding_backward", [&](auto iv) {
    using I = decltype(iv);
    dispatch_float(t, "embedding_backward", [&](auto tv) {
      using T = decltype(tv);
      dispatch_float(dwt, "embedding_backward", [&](auto gv) {
        using G = decltype(gv);
        embedding_bwd<T, G, I><<<unsigned(n), 256, 0, cudaStream_t(s)>>>(
            static_cast<const I*>(ids), static_cast<const T*>(dy), static_cast<G*>(dw), vocab, dim);
      });
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
