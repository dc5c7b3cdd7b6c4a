// SiLU and SwiGLU on the device, in f32 registers.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }

template <class T>
__global__ void silu_fwd(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  GRID_STRIDE(i, n) {
    const float v = to_f32(x[i]);
    y[i] = from_f32<T>(v * sigmoidf(v));
  }
}

template <class T>
__global__ void silu_bwd(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                         int64_t n) {
  GRID_STRIDE(i, n) {
    const float v = to_f32(x[i]), s = sigmoidf(v);
    dx[i] = from_f32<T>(to_f32(dy[i]) * s * (1.f + v * (1.f - s)));
  }
}

template <class T>
__global__ void swiglu_fwd(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y,
                           int64_t n) {
  GRID_STRIDE(i, n) {
    const float v = to_f32(g[i]);
    y[i] = from_f32<T>(v * sigmoidf(v) * to_f32(u[i]));
  }
}

template <class T>
__global__ void swiglu_bwd(const T* __restrict__ dy, const T* __restrict__ g,
                           const T* __restrict__ u, T* __restrict__ dg, T* __restrict__ du,
                           int64_t n) {
  GRID_STRIDE(i, n) {
    const float v = to_f32(g[i]), s = sigmoidf(v), d = to_f32(dy[i]);
    du[i] = from_f32<T>(d * v * s);
    dg[i] = from_f32<T>(d * to_f32(u[i]) * s * (1.f + v * (1.f - s)));
  }
}

#define LAUNCH(op, kernel, ...)                                               \
  if (n == 0) return;                                                         \
  CUDA_CHECK(cudaSetDevice(device));                                          \
  dispatch_float(t, op, [&](auto tv) {                                        \
    using T = decltype(tv);                                                   \
    kernel<T><<<grid_for(n, 256), 256, 0, cudaStream_t(s)>>>(__VA_ARGS__, n); \
  });                                                                         \
  CUDA_CHECK(cudaGetLastError())

void silu_forward(const void* x, void* y, DType t, int64_t n, int device, Stream s) {
  LAUNCH("silu", silu_fwd, static_cast<const T*>(x), static_cast<T*>(y));
}
void silu_backward(const void* dy, const void* x, void* dx, DType t, int64_t n, int device,
                   Stream s) {
  LAUNCH("silu_backward", silu_bwd, static_cast<const T*>(dy), static_cast<const T*>(x),
         static_cast<T*>(dx));
}
void swiglu_forward(const void* g, const void* u, void* y, DType t, int64_t n, int device,
                    Stream s) {
  LAUNCH("swiglu", swiglu_fwd, static_cast<const T*>(g), static_cast<const T*>(u),
         static_cast<T*>(y));
}
void swiglu_backward(const void* dy, const void* g, const void* u, void* dg, void* du, DType t,
                     int64_t n, int device, Stream s) {
  LAUNCH("swiglu_backward", swiglu_bwd, static_cast<const T*>(dy), static_cast<const T*>(g),
         static_cast<const T*>(u), static_cast<T*>(dg), static_cast<T*>(du));
}

}  // namespace fsdp::kernels::cuda
