// RMSNorm on the device. Forward and dx: one block per row, f32 sums.
// dw: one thread per column looping over the rows (coalesced, deterministic,
// no atomics). Same formulas as kernels/cpu/rmsnorm.cpp.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

template <class T>
__global__ void rmsnorm_fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                            float* __restrict__ rstd, int64_t dim, float eps) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * dim;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    const float v = to_f32(xr[c]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float rs = rsqrtf(ss / float(dim) + eps);
  if (threadIdx.x == 0) rstd[row] = rs;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x)
    y[row * dim + c] = from_f32<T>(to_f32(xr[c]) * rs * to_f32(w[c]));
}

template <class T>
__global__ void rmsnorm_bwd_dx(const T* __restrict__ dy, const T* __restrict__ x,
                               const T* __restrict__ w, const float* __restrict__ rstd,
                               T* __restrict__ dx, int64_t dim) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * dim;
  const T* dyr = dy + row * dim;
  const float rs = rstd[row];
  float dot = 0.f;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x)
    dot += to_f32(dyr[c]) * to_f32(w[c]) * to_f32(xr[c]);
  dot = block_sum(dot);
  const float k = dot * rs * rs / float(dim);
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x)
    dx[row * dim + c] = from_f32<T>(rs * (to_f32(dyr[c]) * to_f32(w[c]) - to_f32(xr[c]) * k));
}

template <class T, class G>
__global__ void rmsnorm_bwd_dw(const T* __restrict__ dy, const T* __restrict__ x,
                               const float* __restrict__ rstd, G* __restrict__ dw, int64_t rows,
                               int64_t dim) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= dim) return;
  float acc = 0.f;
  for (int64_t r = 0; r < rows; ++r)
    acc += to_f32(dy[r * dim + c]) * to_f32(x[r * dim + c]) * rstd[r];
  dw[c] = from_f32<G>(to_f32(dw[c]) + acc);
}

void rmsnorm_forward(const void* x, const void* w, void* y, float* rstd, DType t, int64_t rows,
                     int64_t dim, double eps, int device, Stream s) {
  if (rows == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "rmsnorm", [&](auto tv) {
    using T = decltype(tv);
    rmsnorm_fwd<T><<<unsigned(rows), 256, 0, cudaStream_t(s)>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), rstd, dim,
        float(eps));
  });
  CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_backward(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                      void* dw, DType dwt, DType t, int64_t rows, int64_t dim, int device,
                      Stream s) {
  if (rows == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "rmsnorm_backward", [&](auto tv) {
    using T = decltype(tv);
    rmsnorm_bwd_dx<T><<<unsigned(rows), 256, 0, cudaStream_t(s)>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(w), rstd,
        static_cast<T*>(dx), dim);
    if (dw)
      dispatch_float(dwt, "rmsnorm_backward", [&](auto gv) {
        using G = decltype(gv);
        rmsnorm_bwd_dw<T, G><<<grid_for(dim, 256, 1u << 30), 256, 0, cudaStream_t(s)>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), rstd, static_cast<G*>(dw), rows,
            dim);
      });
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
