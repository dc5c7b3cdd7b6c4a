// Shared by the .cu files: error checks, the dtype switches, f32 loads and
// stores for every storage type, and warp/block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "fsdp/core/allocator.h"
#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"

#define CUDA_CHECK(expr)                                                                         \
  do {                                                                                           \
    cudaError_t err_ = (expr);                                                                   \
    if (err_ != cudaSuccess) FSDP_FAIL("[cuda] {} failed: {}", #expr, cudaGetErrorString(err_)); \
  } while (0)

namespace fsdp::kernels::cuda {

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

struct SumOp {
  static constexpr float identity = 0.f;
  __device__ static float apply(float a, float b) { return a + b; }
};
struct MaxOp {
  static constexpr float identity = -INFINITY;
  __device__ static float apply(float a, float b) { return fmaxf(a, b); }
};

template <class Op>
__device__ __forceinline__ float warp_reduce(float v) {
  for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<SumOp>(v); }

// Reduction over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
template <class Op>
__device__ __forceinline__ float block_reduce(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_reduce<Op>(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < int(blockDim.x / 32) ? partial[lane] : Op::identity;
    s = warp_reduce<Op>(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce<SumOp>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<MaxOp>(v); }

// Adds v into a gradient element of any floating storage type.
template <class T>
__device__ __forceinline__ void atomic_add(T* p, float v) {
  if constexpr (std::is_same_v<T, float>)
    atomicAdd(p, v);
  else if constexpr (std::is_same_v<T, double>)
    atomicAdd(p, double(v));
  else
    atomicAdd(p, from_f32<T>(v));  // native bf16/f16 atomics (sm_80+)
}

// Scratch device memory from the caching allocator, so that peak memory counts it (no
// cudaMallocAsync on the side). It goes back to the pool when this object dies, right after the
// launches that use it are queued: only later work on the same compute stream can get the
// block again, and that work runs after them. For launches on the compute stream only.
class Scratch {
 public:
  Scratch(size_t bytes, int device) : bytes_(bytes), device_(device) {
    p_ = allocator_for(Device::cuda(device)).allocate(bytes);
  }
  ~Scratch() { allocator_for(Device::cuda(device_)).deallocate(p_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  size_t bytes_;
  int device_;
  void* p_ = nullptr;
};

inline unsigned grid_for(int64_t n, int block, unsigned cap = 65535u) {
  const int64_t g = (n + block - 1) / block;
  return unsigned(g < 1 ? 1 : (g > cap ? cap : g));
}

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

}  // namespace fsdp::kernels::cuda
