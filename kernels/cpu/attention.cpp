// Multi-head scaled dot-product attention from a packed qkv [B, T, 3d]
// (d = H * hd; q, k, v each laid out head by head, as nn.MultiheadAttention's
// packed in-projection produces). One (batch, head) pair per task; each task
// runs single-threaded BLAS on its own T x T scratch, so memory is
// O(threads * T^2), not O(B * H * T^2). The forward keeps only the row
// log-sum-exp; the backward recomputes the probabilities from it (the
// flash-attention trade of a little compute for a lot of memory).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vec_math.h"

namespace fsdp::kernels::cpu {

template <class T>
void attention_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t T_, int64_t H, int64_t hd,
                       bool causal) {
  const int64_t d = H * hd, ld = 3 * d;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel
  {
    std::vector<T> s(size_t(T_ * T_));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const T* q = qkv + b * T_ * ld + h * hd;
        const T* k = q + d;
        const T* v = q + 2 * d;
        T* o = out + b * T_ * d + h * hd;
        T* l = lse + (b * H + h) * T_;
        gemm<T>(false, true, T_, T_, hd, scale, q, ld, k, ld, T(0), s.data(), T_);
        for (int64_t i = 0; i < T_; ++i) {
          T* row = s.data() + i * T_;
          const int64_t n = causal ? i + 1 : T_;
          T m = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < n; ++j) m = std::max(m, row[j]);
          T sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < n; ++j) {
            row[j] = vexp(row[j] - m);
            sum += row[j];
          }
          const T inv = T(1) / sum;
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) row[j] *= inv;
          for (int64_t j = n; j < T_; ++j) row[j] = T(0);
          l[i] = m + std::log(sum);
        }
        gemm<T>(false, false, T_, hd, T_, T(1), s.data(), T_, v, ld, T(0), o, d);
      }
  }
}

template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv, int64_t B,
                        int64_t T_, int64_t H, int64_t hd, bool causal) {
  const int64_t d = H * hd, ld = 3 * d;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel
  {
    std::vector<T> p(size_t(T_ * T_)), dp(size_t(T_ * T_)), rowdot(static_cast<size_t>(T_));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const T* q = qkv + b * T_ * ld + h * hd;
        const T* k = q + d;
        const T* v = q + 2 * d;
        const T* o = out + b * T_ * d + h * hd;
        const T* dO = dout + b * T_ * d + h * hd;
        const T* l = lse + (b * H + h) * T_;
        T* dq = dqkv + b * T_ * ld + h * hd;
        T* dk = dq + d;
        T* dv = dq + 2 * d;
        // P = exp(scale * q k^T - lse), zero above the diagonal when causal.
        gemm<T>(false, true, T_, T_, hd, scale, q, ld, k, ld, T(0), p.data(), T_);
        for (int64_t i = 0; i < T_; ++i) {
          T* row = p.data() + i * T_;
          const int64_t n = causal ? i + 1 : T_;
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) row[j] = vexp(row[j] - l[i]);
          for (int64_t j = n; j < T_; ++j) row[j] = T(0);
          T acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t c = 0; c < hd; ++c) acc += dO[i * d + c] * o[i * d + c];
          rowdot[i] = acc;
        }
        // dV = P^T dO ; dP = dO V^T
        gemm<T>(true, false, T_, hd, T_, T(1), p.data(), T_, dO, d, T(0), dv, ld);
        gemm<T>(false, true, T_, T_, hd, T(1), dO, d, v, ld, T(0), dp.data(), T_);
        // dS = P * (dP - rowdot), kept in dp
        for (int64_t i = 0; i < T_; ++i) {
          T* dr = dp.data() + i * T_;
          const T* pr = p.data() + i * T_;
#pragma omp simd
          for (int64_t j = 0; j < T_; ++j) dr[j] = pr[j] * (dr[j] - rowdot[i]);
        }
        // dQ = scale dS K ; dK = scale dS^T Q
        gemm<T>(false, false, T_, hd, T_, scale, dp.data(), T_, k, ld, T(0), dq, ld);
        gemm<T>(true, false, T_, hd, T_, scale, dp.data(), T_, q, ld, T(0), dk, ld);
      }
  }
}

#define FSDP_INSTANTIATE(T)                                                                       \
  template void attention_forward<T>(const T*, T*, T*, int64_t, int64_t, int64_t, int64_t, bool); \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, T*, int64_t,        \
                                      int64_t, int64_t, int64_t, bool);
FSDP_INSTANTIATE(float)
FSDP_INSTANTIATE(double)
#undef FSDP_INSTANTIATE

}  // namespace fsdp::kernels::cpu

namespace fsdp::kernels::cpu {

template <class T>
void attention_decode(const T* q, const T* k, const T* v, T* out, int64_t n, int64_t H, int64_t hd,
                      int64_t past) {
  const int64_t d = H * hd;
  const T scale = T(1) / std::sqrt(T(hd));
#pragma omp parallel
  {
    std::vector<T> p(size_t(past + n));
#pragma omp for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const T* qi = q + i * d + h * hd;
        const int64_t keys = past + i + 1;  // causal: up to this query's own position
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          const T* kj = k + j * d + h * hd;
          T s = 0;
          for (int64_t c = 0; c < hd; ++c) s += qi[c] * kj[c];
          p[size_t(j)] = s * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        T sum = 0;
        for (int64_t j = 0; j < keys; ++j) sum += p[size_t(j)] = std::exp(p[size_t(j)] - mx);
        T* o = out + i * d + h * hd;
        for (int64_t c = 0; c < hd; ++c) o[c] = 0;
        for (int64_t j = 0; j < keys; ++j) {
          const T w = p[size_t(j)] / sum;
          const T* vj = v + j * d + h * hd;
          for (int64_t c = 0; c < hd; ++c) o[c] += w * vj[c];
        }
      }
  }
}

template void attention_decode<float>(const float*, const float*, const float*, float*, int64_t,
                                      int64_t, int64_t, int64_t);
template void attention_decode<double>(const double*, const double*, const double*, double*,
                                       int64_t, int64_t, int64_t, int64_t);

}  // namespace fsdp::kernels::cpu
