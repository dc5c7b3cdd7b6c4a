// Elementwise kernels on the device, accumulating in f32 for the narrow types.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

template <class T>
__global__ void add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>)
      out[i] = convert<T>(to_f32(a[i]) + to_f32(b[i]));
    else
      out[i] = a[i] + b[i];
  }
}

void add(const void* a, const void* b, void* out, DType t, int64_t n, int device, void* stream) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  const int block = 256;
  const unsigned grid = std::min<unsigned>(grid_for(n, block), 65535u);
  dispatch_device(t, [&](auto tv) {
    using T = decltype(tv);
    add_kernel<T><<<grid, block, 0, cudaStream_t(stream)>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                           static_cast<T*>(out), n);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
