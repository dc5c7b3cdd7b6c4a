// Fused AdamW over one flat buffer, with torch.optim.AdamW's exact order of
// operations (decoupled decay first, lerp for the first moment, bias
// corrections folded into the step size and the denominator).
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"

namespace fsdp::kernels::cpu {

template <class T>
void adamw(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWArgs& a) {
  const T decay = T(1.0 - a.lr * a.weight_decay);
  const T b2 = T(a.beta2), one_m_b1 = T(1.0 - a.beta1), one_m_b2 = T(1.0 - a.beta2);
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, double(a.step));
  const T step_size = T(a.lr / bc1);
  const T bc2_sqrt = T(std::sqrt(bc2));
  const T eps = T(a.eps);
#pragma omp parallel for simd if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i];
    T p = param[i] * decay;
    T mi = m[i] + one_m_b1 * (g - m[i]);
    T vi = v[i] * b2 + one_m_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = p - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  }
}

template void adamw<float>(float*, const float*, float*, float*, int64_t, const AdamWArgs&);
template void adamw<double>(double*, const double*, double*, double*, int64_t, const AdamWArgs&);

}  // namespace fsdp::kernels::cpu
