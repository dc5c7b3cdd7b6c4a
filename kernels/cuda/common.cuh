// Shared by the .cu files: error checks and the dtype switch for device code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"

#define CUDA_CHECK(expr)                                                                          \
  do {                                                                                            \
    cudaError_t err_ = (expr);                                                                    \
    if (err_ != cudaSuccess) FSDP_FAIL("[cuda] {} failed: {}", #expr, cudaGetErrorString(err_)); \
  } while (0)

namespace fsdp::kernels::cuda {

// Calls f with a value of the device type that matches t.
template <class F>
void dispatch_device(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::bf16: f(__nv_bfloat16{}); return;
    case DType::f16: f(__half{}); return;
    case DType::i32: f(int32_t{}); return;
    case DType::i64: f(int64_t{}); return;
  }
}

template <class T> __device__ __forceinline__ float to_f32(T v) { return float(v); }
template <> __device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

// Converts through double for the wide types and through float for the narrow ones.
template <class D, class S>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<D, S>) return v;
  else if constexpr (std::is_same_v<D, __nv_bfloat16>) return __float2bfloat16(to_f32(v));
  else if constexpr (std::is_same_v<D, __half>) return __float2half(to_f32(v));
  else if constexpr (std::is_same_v<S, __nv_bfloat16> || std::is_same_v<S, __half>) return D(to_f32(v));
  else return D(v);
}

inline unsigned grid_for(int64_t n, int block) { return unsigned((n + block - 1) / block); }

}  // namespace fsdp::kernels::cuda
