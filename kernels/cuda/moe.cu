// A mixture of experts' combine and its backward (kernels/cpu/moe.cpp is the mirror): one block
// per token (combine) or per (token, choice) pair (backward), threads over the columns, sums in
// f64 and one rounding to the storage type. pos is not checked on the host (that would read it
// back): a row index outside [0, R) poisons its token's output (or its pair's weight gradient)
// with NaN instead.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

namespace {

template <class T>
__device__ __forceinline__ double to_f64(T v) {
  return double(to_f32(v));  // f32, bf16 and f16 are exact in f32
}

template <class T>
__device__ __forceinline__ T from_f64(double v) {
  if constexpr (std::is_same_v<T, float>)
    return __double2float_rn(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __double2bfloat16(v);
  else
    return __double2half(v);
}

// The block's sum of v (blockDim.x a multiple of 32, at most 1024), valid in thread 0.
__device__ __forceinline__ double block_sum_f64(double v) {
  __shared__ double partial[32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x >> 5) ? partial[lane] : 0.0;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  }
  return v;
}

template <class T>
__global__ void moe_combine_fwd(const T* __restrict__ rows, const int64_t* __restrict__ pos,
                                const double* __restrict__ weight, const T* __restrict__ base,
                                T* __restrict__ out, int64_t R, int64_t k, int64_t d) {
  const int64_t t = blockIdx.x;
  bool bad = false;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t p = pos[t * k + j];
    bad = bad || p < 0 || p >= R;
  }
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    if (bad) {
      out[t * d + c] = from_f64<T>(NAN);
      continue;
    }
    double acc = base ? to_f64(base[t * d + c]) : 0.0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = t * k + j;
      acc += (weight ? weight[i] : 1.0) * to_f64(rows[pos[i] * d + c]);
    }
    out[t * d + c] = from_f64<T>(acc);
  }
}

template <class T>
__global__ void moe_combine_bwd(const T* __restrict__ dout, const T* __restrict__ rows,
                                const int64_t* __restrict__ pos, const double* __restrict__ weight,
                                T* __restrict__ drows, double* __restrict__ dweight, int64_t R,
                                int64_t k, int64_t d) {
  const int64_t i = blockIdx.x, t = i / k, p = pos[i];
  if (p < 0 || p >= R) {
    if (threadIdx.x == 0) dweight[i] = NAN;
    return;
  }
  const double w = weight ? weight[i] : 1.0;
  double dot = 0;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const double g = to_f64(dout[t * d + c]);
    drows[p * d + c] = from_f64<T>(w * g);
    dot += g * to_f64(rows[p * d + c]);
  }
  dot = block_sum_f64(dot);
  if (threadIdx.x == 0) dweight[i] = dot;
}

constexpr int kThreads = 256;

}  // namespace

void moe_combine(const void* rows, const int64_t* pos, const double* weight, const void* base,
                 void* out, DType t, int64_t R, int64_t n, int64_t k, int64_t d, int device,
                 Stream s) {
  if (n == 0 || d == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "moe_combine", [&](auto tv) {
    using T = decltype(tv);
    moe_combine_fwd<T><<<unsigned(n), kThreads, 0, cudaStream_t(s)>>>(
        static_cast<const T*>(rows), pos, weight, static_cast<const T*>(base),
        static_cast<T*>(out), R, k, d);
  });
  CUDA_CHECK(cudaGetLastError());
}

void moe_combine_backward(const void* dout, const void* rows, const int64_t* pos,
                          const double* weight, void* drows, double* dweight, DType t, int64_t R,
                          int64_t n, int64_t k, int64_t d, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "moe_combine_backward", [&](auto tv) {
    using T = decltype(tv);
    moe_combine_bwd<T><<<unsigned(n * k), kThreads, 0, cudaStream_t(s)>>>(
        static_cast<const T*>(dout), static_cast<const T*>(rows), pos, weight,
        static_cast<T*>(drows), dweight, R, k, d);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
