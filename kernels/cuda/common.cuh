// Shared by the .cu files: core's device dtypes (src/core/cuda/device_dtypes.cuh: error checks,
// the dtype switches, f32 loads and stores, the grid-stride loop), warp/block reductions, atomics
// and scratch memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "fsdp/core/allocator.h"
#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "src/core/cuda/device_dtypes.cuh"

namespace fsdp::kernels::cuda {

using gpu::convert;
using gpu::dispatch_device;
using gpu::dispatch_float;
using gpu::dispatch_index;
using gpu::from_f32;
using gpu::grid_for;
using gpu::launch_vec;
using gpu::load_f32;
using gpu::Pack;
using gpu::store_f32;
using gpu::to_f32;
using gpu::vec_aligned;
using gpu::vec_elems;

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

}  // namespace fsdp::kernels::cuda
