// Multi-head scaled dot-product attention from a packed qkv [B, T, (H + 2 KV) hd]:
// each row holds the H query heads, then the KV key heads, then the KV value
// heads, head by head (nn.MultiheadAttention's packed in-projection when
// KV = H). Grouped-query attention: query head h reads kv head h / (H / KV), as
// Hugging Face's repeat_kv. One (batch, head) pair per task; each task
// runs single-threaded BLAS over tiles of 128 query rows, so its scratch is
// O(threads * 128 * T): never T x T. The forward keeps only the row
// log-sum-exp; the backward recomputes the probabilities from it (the
// flash-attention trade of a little compute for a lot of memory).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <vector>

#include "fsdp/core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vec_math.h"

namespace fsdp::kernels::cpu {

namespace {

constexpr int64_t kRows = 128;  // query rows per tile: scratch is kRows x T per thread, never T x T

// Per-thread scratch of `per_thread` elements, allocated before the parallel region, so an
// allocation failure is the library's out-of-memory error (naming the size) and never an
// exception inside OpenMP (which would terminate the process).
template <class T>
std::vector<T> thread_scratch(const char* op, int64_t per_thread, int64_t T_) {
  const auto n = size_t(per_thread) * size_t(std::max(1, omp_get_max_threads()));
  try {
    return std::vector<T>(n);
  } catch (const std::bad_alloc&) {
    FSDP_FAIL(
        "[{}] out of memory: {} bytes of scratch ({} threads x {} x {} scores) for sequence "
        "length {}",
        op, n * sizeof(T), omp_get_max_threads(), kRows, T_, T_);
  }
}

}  // namespace

// Query rows in tiles of kRows: S = scale Q_tile K^T over the keys the tile may see (all, or up
// to its last row when causal), a row softmax, then O_tile = P V.
template <class T>
void attention_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t T_, int64_t H, int64_t KV,
                       int64_t hd, bool causal) {
  const int64_t d = H * hd, ld = (H + 2 * KV) * hd, R = std::min(kRows, T_), group = H / KV;
  const T scale = T(1) / std::sqrt(T(hd));
  std::vector<T> scratch = thread_scratch<T>("attention", R * T_, T_);
#pragma omp parallel
  {
    T* s = scratch.data() + size_t(omp_get_thread_num()) * size_t(R * T_);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const T* q = qkv + b * T_ * ld + h * hd;
        const T* k = qkv + b * T_ * ld + d + (h / group) * hd;
        const T* v = k + KV * hd;
        for (int64_t i0 = 0; i0 < T_; i0 += R) {
          const int64_t rows = std::min(R, T_ - i0), nk = causal ? i0 + rows : T_;
          gemm<T>(false, true, rows, nk, hd, scale, q + i0 * ld, ld, k, ld, T(0), s, nk);
          for (int64_t r = 0; r < rows; ++r) {
            T* row = s + r * nk;
            const int64_t n = causal ? i0 + r + 1 : T_;
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
            for (int64_t j = n; j < nk; ++j) row[j] = T(0);
            lse[(b * H + h) * T_ + i0 + r] = m + std::log(sum);
          }
          gemm<T>(false, false, rows, hd, nk, T(1), s, nk, v, ld, T(0),
                  out + (b * T_ + i0) * d + h * hd, d);
        }
      }
  }
}

// The same tiles in the backward: P from the saved lse, then per tile dV += P^T dO,
// dS = P (dO V^T - rowdot), dQ_tile = scale dS K, dK += scale dS^T Q_tile. One (b, kv head) per
// task, the query heads of its group and their tiles in order, so dK and dV sum over the group
// without races.
template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv, int64_t B,
                        int64_t T_, int64_t H, int64_t KV, int64_t hd, bool causal) {
  const int64_t d = H * hd, ld = (H + 2 * KV) * hd, R = std::min(kRows, T_), group = H / KV;
  const T scale = T(1) / std::sqrt(T(hd));
  std::vector<T> scratch = thread_scratch<T>("attention_backward", 2 * R * T_ + R, T_);
#pragma omp parallel
  {
    T* p = scratch.data() + size_t(omp_get_thread_num()) * size_t(2 * R * T_ + R);
    T* dp = p + R * T_;
    T* rowdot = dp + R * T_;
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < KV; ++g) {
        const T* k = qkv + b * T_ * ld + d + g * hd;
        const T* v = k + KV * hd;
        T* dk = dqkv + b * T_ * ld + d + g * hd;
        T* dv = dk + KV * hd;
        for (int64_t j = 0; j < T_; ++j)
          for (int64_t c = 0; c < hd; ++c) dk[j * ld + c] = dv[j * ld + c] = T(0);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const T* q = qkv + b * T_ * ld + h * hd;
          const T* o = out + b * T_ * d + h * hd;
          const T* dO = dout + b * T_ * d + h * hd;
          const T* l = lse + (b * H + h) * T_;
          T* dq = dqkv + b * T_ * ld + h * hd;
          for (int64_t i0 = 0; i0 < T_; i0 += R) {
            const int64_t rows = std::min(R, T_ - i0), nk = causal ? i0 + rows : T_;
            // P = exp(scale * q k^T - lse), zero above the diagonal when causal.
            gemm<T>(false, true, rows, nk, hd, scale, q + i0 * ld, ld, k, ld, T(0), p, nk);
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t i = i0 + r, n = causal ? i + 1 : T_;
              T* row = p + r * nk;
#pragma omp simd
              for (int64_t j = 0; j < n; ++j) row[j] = vexp(row[j] - l[i]);
              for (int64_t j = n; j < nk; ++j) row[j] = T(0);
              T acc = 0;
#pragma omp simd reduction(+ : acc)
              for (int64_t c = 0; c < hd; ++c) acc += dO[i * d + c] * o[i * d + c];
              rowdot[r] = acc;
            }
            // dV += P^T dO ; dP = dO V^T
            gemm<T>(true, false, nk, hd, rows, T(1), p, nk, dO + i0 * d, d, T(1), dv, ld);
            gemm<T>(false, true, rows, nk, hd, T(1), dO + i0 * d, d, v, ld, T(0), dp, nk);
            // dS = P * (dP - rowdot), kept in dp
            for (int64_t r = 0; r < rows; ++r) {
              T* dr = dp + r * nk;
              const T* pr = p + r * nk;
#pragma omp simd
              for (int64_t j = 0; j < nk; ++j) dr[j] = pr[j] * (dr[j] - rowdot[r]);
            }
            // dQ = scale dS K ; dK += scale dS^T Q
            gemm<T>(false, false, rows, hd, nk, scale, dp, nk, k, ld, T(0), dq + i0 * ld, ld);
            gemm<T>(true, false, nk, hd, rows, scale, dp, nk, q + i0 * ld, ld, T(1), dk, ld);
          }
        }
      }
  }
}

#define FSDP_INSTANTIATE(T)                                                                \
  template void attention_forward<T>(const T*, T*, T*, int64_t, int64_t, int64_t, int64_t, \
                                     int64_t, bool);                                       \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, T*, int64_t, \
                                      int64_t, int64_t, int64_t, int64_t, bool);
FSDP_INSTANTIATE(float)
FSDP_INSTANTIATE(double)
#undef FSDP_INSTANTIATE

}  // namespace fsdp::kernels::cpu

namespace fsdp::kernels::cpu {

template <class T>
void attention_decode(const T* q, const T* k, const T* v, T* out, int64_t n, int64_t H, int64_t KV,
                      int64_t hd, int64_t past) {
  const int64_t d = H * hd, dkv = KV * hd, group = H / KV;
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
          const T* kj = k + j * dkv + (h / group) * hd;
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
          const T* vj = v + j * dkv + (h / group) * hd;
          for (int64_t c = 0; c < hd; ++c) o[c] += w * vj[c];
        }
      }
  }
}

template void attention_decode<float>(const float*, const float*, const float*, float*, int64_t,
                                      int64_t, int64_t, int64_t, int64_t);
template void attention_decode<double>(const double*, const double*, const double*, double*,
                                       int64_t, int64_t, int64_t, int64_t, int64_t);

}  // namespace fsdp::kernels::cpu
