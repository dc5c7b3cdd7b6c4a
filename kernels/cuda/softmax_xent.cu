// Fused softmax + cross-entropy on the device: one block per row. The
// forward keeps the row's log-sum-exp and adds the row's share of the loss (its loss over the
// divisor; nothing for a target of kIgnoreIndex) into one device f64 (no host sync: the caller
// reads it when it prints); the backward writes dlogits from the logits and lse, so the
// probabilities are never stored, and zeroes an ignored row.
#include "fsdp/core/ignore_index.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

template <class T, class I>
__global__ void xent_fwd(const T* __restrict__ logits, const I* __restrict__ targets,
                         float* __restrict__ lse, double* __restrict__ mean_loss,
                         double inv_divisor, int64_t v) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * v;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, to_f32(x[j]));
  m = block_max(m);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) sum += __expf(to_f32(x[j]) - m);
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    const float l = m + logf(sum);
    lse[row] = l;
    const int64_t tgt = int64_t(targets[row]);
    if (tgt != kIgnoreIndex)
      atomicAdd(mean_loss,
                tgt >= 0 && tgt < v ? double(l - to_f32(x[tgt])) * inv_divisor : double(NAN));
  }
}

// d may be the logits themselves (cross_entropy_backward_): each element is read, then written,
// by one thread, so neither pointer is __restrict__.
template <class T, class I>
__global__ void xent_bwd(const T* logits, const I* __restrict__ targets,
                         const float* __restrict__ lse, T* d, float k, int64_t v) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * v;
  T* dr = d + row * v;
  const float l = lse[row];
  const int64_t tgt = int64_t(targets[row]);
  if (tgt == kIgnoreIndex) {
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) dr[j] = from_f32<T>(0.f);
    return;
  }
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
    dr[j] = from_f32<T>(__expf(to_f32(x[j]) - l) * k - (j == tgt ? k : 0.f));
}

void softmax_xent_forward(const void* logits, const void* targets, DType tt, float* lse,
                          double* mean_loss, DType t, int64_t n, int64_t v, double divisor,
                          int device, Stream s) {
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMemsetAsync(mean_loss, 0, sizeof(double), cudaStream_t(s)));
  dispatch_index(tt, "cross_entropy", [&](auto iv) {
    using I = decltype(iv);
    dispatch_float(t, "cross_entropy", [&](auto tv) {
      using T = decltype(tv);
      xent_fwd<T, I><<<unsigned(n), 512, 0, cudaStream_t(s)>>>(static_cast<const T*>(logits),
                                                               static_cast<const I*>(targets), lse,
                                                               mean_loss, 1.0 / divisor, v);
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

void softmax_xent_backward(const void* logits, const void* targets, DType tt, const float* lse,
                           void* dlogits, DType t, double dloss, double divisor, int64_t n,
                           int64_t v, int device, Stream s) {
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_index(tt, "cross_entropy_backward", [&](auto iv) {
    using I = decltype(iv);
    dispatch_float(t, "cross_entropy_backward", [&](auto tv) {
      using T = decltype(tv);
      xent_bwd<T, I><<<unsigned(n), 512, 0, cudaStream_t(s)>>>(
          static_cast<const T*>(logits), static_cast<const I*>(targets), lse,
          static_cast<T*>(dlogits), float(dloss / divisor), v);
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
