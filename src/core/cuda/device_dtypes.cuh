// The dtypes on the device, shared by core's CUDA half (src/core/cuda/cast_fill.cu) and the
// kernels (kernels/cuda/common.cuh brings them into fsdp::kernels::cuda): the error check, the
// dtype switches, f32 loads and stores for every storage type, and the grid-stride loop. Core's
// own, so that core never includes a kernel (scripts/check_layers.py).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"

#define CUDA_CHECK(expr)                                                                         \
  do {                                                                                           \
    cudaError_t err_ = (expr);                                                                   \
    if (err_ != cudaSuccess) FSDP_FAIL("[cuda] {} failed: {}", #expr, cudaGetErrorString(err_)); \
  } while (0)

namespace fsdp::gpu {

// Calls f with a value of the device type that matches t.
template <class F>
void dispatch_device(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      f(float{});
      return;
    case DType::f64:
      f(double{});
      return;
    case DType::bf16:
      f(__nv_bfloat16{});
      return;
    case DType::f16:
      f(__half{});
      return;
    case DType::i32:
      f(int32_t{});
      return;
    case DType::i64:
      f(int64_t{});
      return;
  }
}

// The floating storage types the compute kernels take.
template <class F>
void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      f(float{});
      return;
    case DType::bf16:
      f(__nv_bfloat16{});
      return;
    case DType::f16:
      f(__half{});
      return;
    default:
      FSDP_FAIL("[{}] CUDA kernels take f32, bf16 or f16, got {}", op, dtype_name(t));
  }
}

template <class F>
void dispatch_index(DType t, const char* op, F&& f) {
  if (t == DType::i32) return f(int32_t{});
  if (t == DType::i64) return f(int64_t{});
  FSDP_FAIL("[{}] token ids must be i32 or i64, got {}", op, dtype_name(t));
}

template <class T>
__device__ __forceinline__ float to_f32(T v) {
  return float(v);
}
template <>
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f32(__half v) {
  return __half2float(v);
}

// Converts through double for the wide types and through float for the narrow ones.
template <class D, class S>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<D, S>)
    return v;
  else if constexpr (std::is_same_v<D, __nv_bfloat16>)
    return __float2bfloat16(to_f32(v));
  else if constexpr (std::is_same_v<D, __half>)
    return __float2half(to_f32(v));
  else if constexpr (std::is_same_v<S, __nv_bfloat16> || std::is_same_v<S, __half>)
    return D(to_f32(v));
  else
    return D(v);
}

template <class T>
__device__ __forceinline__ T from_f32(float v) {
  return convert<T>(v);
}

inline unsigned grid_for(int64_t n, int block, unsigned cap = 65535u) {
  const int64_t g = (n + block - 1) / block;
  return unsigned(g < 1 ? 1 : (g > cap ? cap : g));
}

// 16-byte loads and stores: Pack<T, N> is N consecutive elements read or written in one access,
// where their address is aligned to the pack (16 bytes, or 8 for four bf16 beside four f32).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
// Elements per access for a kernel over storage types T...: 16 bytes of the widest.
template <class... T>
constexpr int vec_elems() {
  size_t widest = 1;
  ((widest = sizeof(T) > widest ? sizeof(T) : widest), ...);
  return int(16 / widest);
}
// On the host: whether p may be read or written N elements at a time.
template <int N, class T>
inline bool vec_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * N) == 0;
}
template <int N, class T>
__device__ __forceinline__ void load_f32(const T* p, float (&v)[N]) {
  const Pack<T, N> pk = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = to_f32(pk.v[k]);
}
template <int N, class T>
__device__ __forceinline__ void store_f32(T* p, const float (&v)[N]) {
  Pack<T, N> pk;
#pragma unroll
  for (int k = 0; k < N; ++k) pk.v[k] = from_f32<T>(v[k]);
  *reinterpret_cast<Pack<T, N>*>(p) = pk;
}
// Launches an elementwise kernel N elements a thread-step: launch(W, offset, count), W an
// std::integral_constant, is called with W = N over the longest prefix whose count is a multiple
// of N where `aligned` (every pointer vec_aligned<N>), and with W = 1 over the rest (all of it
// where not aligned). The kernel reads and writes elements [offset, offset + count), W at a time.
template <int N, class Launch>
void launch_vec(int64_t n, bool aligned, Launch&& launch) {
  const int64_t head = aligned ? n / N * N : 0;
  if (head > 0) launch(std::integral_constant<int, N>{}, int64_t(0), head);
  if (head < n) launch(std::integral_constant<int, 1>{}, head, n - head);
}

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

}  // namespace fsdp::gpu
