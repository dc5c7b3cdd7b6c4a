// SiLU, SwiGLU and GeGLU (gelu's tanh form, as kernels/cpu/activation.cpp) on the device, in f32
// registers.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }

// N elements a thread-step: 16-byte loads and stores where every pointer is aligned to them (see
// launch_vec), one element elsewhere and on the tail.
template <int N, class T>
__global__ void silu_fwd(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  GRID_STRIDE(j, n / N) {
    float v[N];
    load_f32<N>(x + j * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] *= sigmoidf(v[k]);
    store_f32<N>(y + j * N, v);
  }
}

template <int N, class T>
__global__ void silu_bwd(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                         int64_t n) {
  GRID_STRIDE(j, n / N) {
    float v[N], d[N];
    load_f32<N>(x + j * N, v);
    load_f32<N>(dy + j * N, d);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float sg = sigmoidf(v[k]);
      d[k] = d[k] * sg * (1.f + v[k] * (1.f - sg));
    }
    store_f32<N>(dx + j * N, d);
  }
}

constexpr float kGeluK = 0.7978845608028654f, kGeluC = 0.044715f;

template <int N, class T, bool kGelu>
__global__ void swiglu_fwd(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y,
                           int64_t n) {
  GRID_STRIDE(j, n / N) {
    float v[N], up[N];
    load_f32<N>(g + j * N, v);
    load_f32<N>(u + j * N, up);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if constexpr (kGelu)
        v[k] = 0.5f * v[k] * (1.f + tanhf(kGeluK * (v[k] + kGeluC * v[k] * v[k] * v[k]))) * up[k];
      else
        v[k] = v[k] * sigmoidf(v[k]) * up[k];
    }
    store_f32<N>(y + j * N, v);
  }
}

template <int N, class T, bool kGelu>
__global__ void swiglu_bwd(const T* __restrict__ dy, const T* __restrict__ g,
                           const T* __restrict__ u, T* __restrict__ dg, T* __restrict__ du,
                           int64_t n) {
  GRID_STRIDE(j, n / N) {
    float v[N], d[N], up[N], dgv[N], duv[N];
    load_f32<N>(g + j * N, v);
    load_f32<N>(dy + j * N, d);
    load_f32<N>(u + j * N, up);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if constexpr (kGelu) {
        const float t = tanhf(kGeluK * (v[k] + kGeluC * v[k] * v[k] * v[k]));
        duv[k] = d[k] * (0.5f * v[k] * (1.f + t));
        dgv[k] = d[k] * up[k] *
                 (0.5f * (1.f + t) +
                  0.5f * v[k] * (1.f - t * t) * kGeluK * (1.f + 3.f * kGeluC * v[k] * v[k]));
      } else {
        const float sg = sigmoidf(v[k]);
        duv[k] = d[k] * v[k] * sg;
        dgv[k] = d[k] * up[k] * sg * (1.f + v[k] * (1.f - sg));
      }
    }
    store_f32<N>(du + j * N, duv);
    store_f32<N>(dg + j * N, dgv);
  }
}

// The launches: W elements a thread-step over each part launch_vec makes of the n elements.
template <class T>
void silu_fwd_launch(const T* x, T* y, int64_t n, Stream s) {
  constexpr int N = vec_elems<T>();
  launch_vec<N>(n, vec_aligned<N>(x) && vec_aligned<N>(y), [&](auto w, int64_t off, int64_t cnt) {
    constexpr int W = decltype(w)::value;
    silu_fwd<W, T><<<grid_for(cnt / W, 256), 256, 0, cudaStream_t(s)>>>(x + off, y + off, cnt);
  });
}
template <class T>
void silu_bwd_launch(const T* dy, const T* x, T* dx, int64_t n, Stream s) {
  constexpr int N = vec_elems<T>();
  launch_vec<N>(n, vec_aligned<N>(dy) && vec_aligned<N>(x) && vec_aligned<N>(dx),
                [&](auto w, int64_t off, int64_t cnt) {
                  constexpr int W = decltype(w)::value;
                  silu_bwd<W, T><<<grid_for(cnt / W, 256), 256, 0, cudaStream_t(s)>>>(
                      dy + off, x + off, dx + off, cnt);
                });
}
template <bool kGelu, class T>
void swiglu_fwd_launch(const T* g, const T* u, T* y, int64_t n, Stream s) {
  constexpr int N = vec_elems<T>();
  launch_vec<N>(n, vec_aligned<N>(g) && vec_aligned<N>(u) && vec_aligned<N>(y),
                [&](auto w, int64_t off, int64_t cnt) {
                  constexpr int W = decltype(w)::value;
                  swiglu_fwd<W, T, kGelu><<<grid_for(cnt / W, 256), 256, 0, cudaStream_t(s)>>>(
                      g + off, u + off, y + off, cnt);
                });
}
template <bool kGelu, class T>
void swiglu_bwd_launch(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n, Stream s) {
  constexpr int N = vec_elems<T>();
  const bool aligned = vec_aligned<N>(dy) && vec_aligned<N>(g) && vec_aligned<N>(u) &&
                       vec_aligned<N>(dg) && vec_aligned<N>(du);
  launch_vec<N>(n, aligned, [&](auto w, int64_t off, int64_t cnt) {
    constexpr int W = decltype(w)::value;
    swiglu_bwd<W, T, kGelu><<<grid_for(cnt / W, 256), 256, 0, cudaStream_t(s)>>>(
        dy + off, g + off, u + off, dg + off, du + off, cnt);
  });
}

void silu_forward(const void* x, void* y, DType t, int64_t n, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "silu", [&](auto tv) {
    using T = decltype(tv);
    silu_fwd_launch(static_cast<const T*>(x), static_cast<T*>(y), n, s);
  });
  CUDA_CHECK(cudaGetLastError());
}
void silu_backward(const void* dy, const void* x, void* dx, DType t, int64_t n, int device,
                   Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "silu_backward", [&](auto tv) {
    using T = decltype(tv);
    silu_bwd_launch(static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<T*>(dx), n, s);
  });
  CUDA_CHECK(cudaGetLastError());
}
void swiglu_forward(const void* g, const void* u, void* y, DType t, int64_t n, bool gelu,
                    int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, gelu ? "geglu" : "swiglu", [&](auto tv) {
    using T = decltype(tv);
    const T* pg = static_cast<const T*>(g);
    const T* pu = static_cast<const T*>(u);
    T* py = static_cast<T*>(y);
    if (gelu)
      swiglu_fwd_launch<true>(pg, pu, py, n, s);
    else
      swiglu_fwd_launch<false>(pg, pu, py, n, s);
  });
  CUDA_CHECK(cudaGetLastError());
}
void swiglu_backward(const void* dy, const void* g, const void* u, void* dg, void* du, DType t,
                     int64_t n, bool gelu, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, gelu ? "geglu_backward" : "swiglu_backward", [&](auto tv) {
    using T = decltype(tv);
    const T* pdy = static_cast<const T*>(dy);
    const T* pg = static_cast<const T*>(g);
    const T* pu = static_cast<const T*>(u);
    T* pdg = static_cast<T*>(dg);
    T* pdu = static_cast<T*>(du);
    if (gelu)
      swiglu_bwd_launch<true>(pdy, pg, pu, pdg, pdu, n, s);
    else
      swiglu_bwd_launch<false>(pdy, pg, pu, pdg, pdu, n, s);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
