// Fused AdamW over many flat buffers on the device in one launch (PyTorch's multi_tensor_apply):
// the buffers' addresses travel in the kernel's parameters, 48 tensors a launch, and each block
// steps one chunk of one tensor. torch.optim.AdamW's order of operations (as
// kernels/cpu/adamw.cpp), state in the parameters' dtype. Clipping's factor is computed per
// thread from the global squared norm on the device (as clip_scale_kernel) and applied with
// __fmul_rn, which nvcc never contracts into an FMA, then rounded to T: the bits of scaling the
// gradients in place first.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

namespace {

constexpr int kTensorsPerLaunch = 48;  // the table stays well under the 4 KiB of parameters
constexpr int kThreads = 256;
constexpr int64_t kChunk = 4096;  // elements a block steps

struct AdamWTable {
  void* p[kTensorsPerLaunch];
  const void* g[kTensorsPerLaunch];
  void* m[kTensorsPerLaunch];
  void* v[kTensorsPerLaunch];
  int64_t n[kTensorsPerLaunch];
  float decay[kTensorsPerLaunch];
  int block_start[kTensorsPerLaunch + 1];  // each tensor's first block
  int count;
};

template <class T>
__global__ void adamw_multi_kernel(const AdamWTable tab, float b2, float one_m_b1, float one_m_b2,
                                   float step_size, float bc2_sqrt, float eps,
                                   const double* __restrict__ total_sq, double max_norm) {
  const int block = int(blockIdx.x);
  int t = 0;  // the tensor whose chunk this block steps
  while (t + 1 < tab.count && tab.block_start[t + 1] <= block) ++t;
  const int64_t begin = int64_t(block - tab.block_start[t]) * kChunk;
  const int64_t end = min(tab.n[t], begin + kChunk);
  T* __restrict__ p = static_cast<T*>(tab.p[t]);
  const T* __restrict__ g = static_cast<const T*>(tab.g[t]);
  T* __restrict__ m = static_cast<T*>(tab.m[t]);
  T* __restrict__ v = static_cast<T*>(tab.v[t]);
  const float decay = tab.decay[t];
  float coef = 1.0f;
  if (total_sq) {
    const double c = max_norm / (sqrt(*total_sq) + 1e-6);
    if (c < 1.0) coef = float(c);
  }
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float gi = coef == 1.0f ? to_f32(g[i]) : to_f32(from_f32<T>(__fmul_rn(to_f32(g[i]), coef)));
    const float pi = to_f32(p[i]) * decay;
    const float mi = to_f32(m[i]) + one_m_b1 * (gi - to_f32(m[i]));
    const float vi = to_f32(v[i]) * b2 + one_m_b2 * gi * gi;
    m[i] = from_f32<T>(mi);
    v[i] = from_f32<T>(vi);
    p[i] = from_f32<T>(pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps));
  }
}

}  // namespace

void adamw_multi(const AdamWBuffers* bufs, int64_t count, DType t, double lr, double beta1,
                 double beta2, double eps, int64_t step, const double* total_sq, double max_norm,
                 int device, Stream s) {
  CUDA_CHECK(cudaSetDevice(device));
  const double bc1 = 1.0 - std::pow(beta1, double(step)), bc2 = 1.0 - std::pow(beta2, double(step));
  dispatch_float(t, "adamw", [&](auto tv) {
    using T = decltype(tv);
    auto launch = [&](const AdamWTable& tab) {
      if (tab.count == 0 || tab.block_start[tab.count] == 0) return;
      adamw_multi_kernel<T><<<tab.block_start[tab.count], kThreads, 0, cudaStream_t(s)>>>(
          tab, float(beta2), float(1.0 - beta1), float(1.0 - beta2), float(lr / bc1),
          float(std::sqrt(bc2)), float(eps), total_sq, max_norm);
      CUDA_CHECK(cudaGetLastError());
    };
    AdamWTable tab{};
    for (int64_t i = 0; i < count; ++i) {
      const AdamWBuffers& b = bufs[i];
      if (b.n == 0) continue;
      const int64_t blocks = (b.n + kChunk - 1) / kChunk;
      // A full table, or a grid past 2^30 blocks: launch what is there and start a new one.
      if (tab.count == kTensorsPerLaunch || int64_t(tab.block_start[tab.count]) + blocks > (1 << 30)) {
        launch(tab);
        tab = AdamWTable{};
      }
      FSDP_CHECK(blocks <= (1 << 30), "[adamw] a tensor of {} elements is too large for one launch",
                 b.n);
      const int k = tab.count++;
      tab.p[k] = b.param;
      tab.g[k] = b.grad;
      tab.m[k] = b.m;
      tab.v[k] = b.v;
      tab.n[k] = b.n;
      tab.decay[k] = float(1.0 - lr * b.weight_decay);
      tab.block_start[k + 1] = tab.block_start[k] + int(blocks);
    }
    launch(tab);
  });
}

}  // namespace fsdp::kernels::cuda
