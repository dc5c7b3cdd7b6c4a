// Fused AdamW over one flat buffer on the device, torch.optim.AdamW's order
// of operations (as kernels/cpu/adamw.cpp), state in the parameters' dtype.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

template <class T>
__global__ void adamw_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                             T* __restrict__ v, int64_t n, float decay, float b2, float one_m_b1,
                             float one_m_b2, float step_size, float bc2_sqrt, float eps) {
  GRID_STRIDE(i, n) {
    const float gi = to_f32(g[i]);
    const float pi = to_f32(p[i]) * decay;
    const float mi = to_f32(m[i]) + one_m_b1 * (gi - to_f32(m[i]));
    const float vi = to_f32(v[i]) * b2 + one_m_b2 * gi * gi;
    m[i] = from_f32<T>(mi);
    v[i] = from_f32<T>(vi);
    p[i] = from_f32<T>(pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps));
  }
}

void adamw(void* param, const void* grad, void* m, void* v, DType t, int64_t n, double lr,
           double beta1, double beta2, double eps, double weight_decay, int64_t step, int device,
           Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  const double bc1 = 1.0 - std::pow(beta1, double(step)), bc2 = 1.0 - std::pow(beta2, double(step));
  dispatch_float(t, "adamw", [&](auto tv) {
    using T = decltype(tv);
    adamw_kernel<T><<<grid_for(n, 256), 256, 0, cudaStream_t(s)>>>(
        static_cast<T*>(param), static_cast<const T*>(grad), static_cast<T*>(m), static_cast<T*>(v),
        n, float(1.0 - lr * weight_decay), float(beta2), float(1.0 - beta1), float(1.0 - beta2),
        float(lr / bc1), float(std::sqrt(bc2)), float(eps));
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
