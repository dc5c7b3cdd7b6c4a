// dtype casts and fills on the device: one thread per element, grid-stride.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

template <class D, class S>
__global__ void cast_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = convert<D>(src[i]);
}

template <class T>
__global__ void fill_kernel(T* __restrict__ dst, T value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

void memcpy_sync(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  cudaMemcpyKind kind = dst_dev.is_cpu() ? (src_dev.is_cpu() ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
                                         : (src_dev.is_cpu() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
  CUDA_CHECK(cudaMemcpy(dst, src, nbytes, kind));
}

void cast(void* dst, DType dst_t, const void* src, DType src_t, int64_t n, int device, void* stream) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  const int block = 256;
  const unsigned grid = std::min<unsigned>(grid_for(n, block), 65535u);
  dispatch_device(dst_t, [&](auto dv) {
    using D = decltype(dv);
    dispatch_device(src_t, [&](auto sv) {
      using S = decltype(sv);
      cast_kernel<D, S><<<grid, block, 0, cudaStream_t(stream)>>>(static_cast<D*>(dst), static_cast<const S*>(src), n);
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

void fill(void* dst, DType t, int64_t n, double value, int device, void* stream) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  const int block = 256;
  const unsigned grid = std::min<unsigned>(grid_for(n, block), 65535u);
  dispatch_device(t, [&](auto tv) {
    using T = decltype(tv);
    T v = convert<T>(value);
    fill_kernel<T><<<grid, block, 0, cudaStream_t(stream)>>>(static_cast<T*>(dst), v, n);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
