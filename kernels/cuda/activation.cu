// SiLU, SwiGLU and GeGLU (gelu's tanh form, as kernels/cpu/activation.cpp) on the device, in f32
// registers.
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

constexpr float kGeluK = 0.7978845608028654f, kGeluC = 0.044715f;

template <class T, bool kGelu>
__global__ void swiglu_fwd(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y,
                           int64_t n) {
  GRID_STRIDE(i, n) {
    const float v = to_f32(g[i]);
    if constexpr (kGelu)
      y[i] =
          from_f32<T>(0.5f * v * (1.f + tanhf(kGeluK * (v + kGeluC * v * v * v))) * to_f32(u[i]));
    else
      y[i] = from_f32<T>(v * sigmoidf(v) * to_f32(u[i]));
  }
}

template <class T, bool kGelu>
__global__ void swiglu_bwd(const T* __restrict__ dy, const T* __restrict__ g,
                           const T* __restrict__ u, T* __restrict__ dg, T* __restrict__ du,
                           int64_t n) {
  GRID_STRIDE(i, n) {
    const float v = to_f32(g[i]), d = to_f32(dy[i]);
    if constexpr (kGelu) {
      const float t = tanhf(kGeluK * (v + kGeluC * v * v * v));
      du[i] = from_f32<T>(d * (0.5f * v * (1.f + t)));
      dg[i] = from_f32<T>(
          d * to_f32(u[i]) *
          (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * kGeluK * (1.f + 3.f * kGeluC * v * v)));
    } else {
      const float s = sigmoidf(v);
      du[i] = from_f32<T>(d * v * s);
      dg[i] = from_f32<T>(d * to_f32(u[i]) * s * (1.f + v * (1.f - s)));
    }
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
// LAUNCH with a second template argument (a bool: which activation).
#define LAUNCH2(op, kernel, flag, ...)                                              \
  if (n == 0) return;                                                               \
  CUDA_CHECK(cudaSetDevice(device));                                                \
  dispatch_float(t, op, [&](auto tv) {                                              \
    using T = decltype(tv);                                                         \
    kernel<T, flag><<<grid_for(n, 256), 256, 0, cudaStream_t(s)>>>(__VA_ARGS__, n); \
  });                                                                               \
  CUDA_CHECK(cudaGetLastError())

void silu_forward(const void* x, void* y, DType t, int64_t n, int device, Stream s) {
  LAUNCH("silu", silu_fwd, static_cast<const T*>(x), static_cast<T*>(y));
}
void silu_backward(const void* dy, const void* x, void* dx, DType t, int64_t n, int device,
                   Stream s) {
  LAUNCH("silu_backward", silu_bwd, static_cast<const T*>(dy), static_cast<const T*>(x),
         static_cast<T*>(dx));
}
void swiglu_forward(const void* g, const void* u, void* y, DType t, int64_t n, bool gelu,
                    int device, Stream s) {
  if (gelu) {
    LAUNCH2("geglu", swiglu_fwd, true, static_cast<const T*>(g), static_cast<const T*>(u),
            static_cast<T*>(y));
  } else {
    LAUNCH2("swiglu", swiglu_fwd, false, static_cast<const T*>(g), static_cast<const T*>(u),
            static_cast<T*>(y));
  }
}
void swiglu_backward(const void* dy, const void* g, const void* u, void* dg, void* du, DType t,
                     int64_t n, bool gelu, int device, Stream s) {
  if (gelu) {
    LAUNCH2("geglu_backward", swiglu_bwd, true, static_cast<const T*>(dy), static_cast<const T*>(g),
            static_cast<const T*>(u), static_cast<T*>(dg), static_cast<T*>(du));
  } else {
    LAUNCH2("swiglu_backward", swiglu_bwd, false, static_cast<const T*>(dy),
            static_cast<const T*>(g), static_cast<const T*>(u), static_cast<T*>(dg),
            static_cast<T*>(du));
  }
}

}  // namespace fsdp::kernels::cuda
