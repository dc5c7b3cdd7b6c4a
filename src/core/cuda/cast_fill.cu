// core's device copies, casts and fills (src/core/gpu.h), on the device's compute stream.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "src/core/cuda/device_dtypes.cuh"
#include "src/core/gpu.h"

namespace fsdp::gpu {

template <class D, class S>
__global__ void cast_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  GRID_STRIDE(i, n) dst[i] = convert<D>(src[i]);
}

// The value arrives as a double and is converted here, on the device: convert<> is a
// __device__ function, and calling it in a launch's arguments (host code) compiles to
// nvcc's host stand-in, which calls exit(1) without a word.
template <class T>
__global__ void fill_kernel(T* __restrict__ dst, double value, int64_t n) {
  const T v = convert<T>(value);
  GRID_STRIDE(i, n) dst[i] = v;
}

void memcpy_sync(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes) {
  cudaMemcpyKind kind =
      dst_device.is_cpu() ? (src_device.is_cpu() ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
                          : (src_device.is_cpu() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
  // On the device's legacy stream, which the (blocking) compute stream of that device orders
  // against: from any thread, the copy sees the work queued there before it.
  if (!dst_device.is_cpu() || !src_device.is_cpu())
    CUDA_CHECK(cudaSetDevice(dst_device.is_cpu() ? src_device.index : dst_device.index));
  CUDA_CHECK(cudaMemcpy(dst, src, size_t(bytes), kind));
}

void cast(void* dst, DType dst_t, const void* src, DType src_t, int64_t n, int device) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream = static_cast<cudaStream_t>(compute_stream(device));
  if (dst_t == src_t) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * dtype_size(dst_t), cudaMemcpyDeviceToDevice,
                               stream));
    return;
  }
  dispatch_device(dst_t, [&](auto dv) {
    using D = decltype(dv);
    dispatch_device(src_t, [&](auto sv) {
      using S = decltype(sv);
      cast_kernel<D, S><<<grid_for(n, 256), 256, 0, stream>>>(
          static_cast<D*>(dst), static_cast<const S*>(src), n);
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

void fill(void* dst, DType t, int64_t n, double value, int device) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream = static_cast<cudaStream_t>(compute_stream(device));
  dispatch_device(t, [&](auto tv) {
    using T = decltype(tv);
    fill_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(static_cast<T*>(dst), value, n);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::gpu
