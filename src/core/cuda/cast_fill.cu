// core's device copies, casts and fills (src/core/gpu.h), on the device's compute stream.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "src/core/cuda/device_dtypes.cuh"
#include "src/core/gpu.h"

namespace fsdp::gpu {

// N elements a thread-step (16-byte accesses where launch_vec found the pointers aligned).
template <int N, class D, class S>
__global__ void cast_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  GRID_STRIDE(j, n / N) {
    const Pack<S, N> in = *reinterpret_cast<const Pack<S, N>*>(src + j * N);
    Pack<D, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = convert<D>(in.v[k]);
    *reinterpret_cast<Pack<D, N>*>(dst + j * N) = out;
  }
}

// The value arrives as a double and is converted here, on the device: convert<> is a
// __device__ function, and calling it in a launch's arguments (host code) compiles to
// nvcc's host stand-in, which calls exit(1) without a word.
template <int N, class T>
__global__ void fill_kernel(T* __restrict__ dst, double value, int64_t n) {
  Pack<T, N> pk;
#pragma unroll
  for (int k = 0; k < N; ++k) pk.v[k] = convert<T>(value);
  GRID_STRIDE(j, n / N) * reinterpret_cast<Pack<T, N>*>(dst + j * N) = pk;
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
      constexpr int N = vec_elems<D, S>();
      D* d = static_cast<D*>(dst);
      const S* sp = static_cast<const S*>(src);
      launch_vec<N>(n, vec_aligned<N>(d) && vec_aligned<N>(sp),
                    [&](auto w, int64_t off, int64_t cnt) {
                      constexpr int W = decltype(w)::value;
                      cast_kernel<W, D, S>
                          <<<grid_for(cnt / W, 256), 256, 0, stream>>>(d + off, sp + off, cnt);
                    });
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
    constexpr int N = vec_elems<T>();
    T* d = static_cast<T*>(dst);
    launch_vec<N>(n, vec_aligned<N>(d), [&](auto w, int64_t off, int64_t cnt) {
      constexpr int W = decltype(w)::value;
      fill_kernel<W, T><<<grid_for(cnt / W, 256), 256, 0, stream>>>(d + off, value, cnt);
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::gpu
