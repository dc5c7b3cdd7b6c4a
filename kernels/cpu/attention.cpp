// Multi-head scaled dot-product attention from a packed qkv [B, T, (H + 2 KV) hd]:
// each row holds the H query heads, then the KV key heads, then the KV value
// heads, head by head (nn.MultiheadAttention's packed in-projection when
// KV = H). Grouped-query attention: query head h reads kv head h / (H / KV), as
// Hugging Face's repeat_kv. One (row, head, chunk of the row) per task; each task
// runs single-threaded BLAS over tiles of 128 query rows, so its scratch is
// O(threads * 128 * T): never T x T. The forward keeps only the row
// log-sum-exp; the backward recomputes the probabilities from it (the
// flash-attention trade of a little compute for a lot of memory).
//
// Packed rows: with doc_start [B, T] (the first position of each token's document in its row),
// a query sees only the keys of its own document, causally. The tiles then never cross a
// document's start, and each tile's scores cover only its document's keys: the blocks outside
// every document are skipped, not masked, so a row of 8 packed samples costs what 8 rows of one
// sample cost. A sliding window (window > 0, causal: Gemma 3's local layers, Mistral's) keeps
// query t to keys t - window + 1 .. t; its tiles are at most a window of rows, and the keys before
// a tile's window are skipped.
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
int64_t per_thread_scratch(bool backward, int64_t T_) {
  const int64_t R = std::min(kRows, T_);
  return backward ? 2 * R * T_ + R : R * T_;
}

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

// Calls f(i0, rows, j0) for the query tiles of rows [begin, end) of one row of the batch: at most
// R rows each, every row of a tile in one document (ds: the row's doc_start, or null for one
// document), j0 the first key the tile's rows may see.
template <class F>
void for_each_tile(const int32_t* ds, int64_t begin, int64_t end, int64_t R, F&& f) {
  for (int64_t i0 = begin; i0 < end;) {
    int64_t stop = std::min(end, i0 + R);
    if (ds) {
      int64_t e = i0 + 1;
      while (e < stop && ds[e] == ds[i0]) ++e;
      stop = e;
    }
    f(i0, stop - i0, ds ? int64_t(ds[i0]) : int64_t(0));
    i0 = stop;
  }
}

// The work of one (row, head) or (row, kv head) task: positions [begin, end) of row b.
struct Chunk {
  int64_t b, begin, end;
};

// The rows cut into chunks that need nothing from each other: packed rows at document starts,
// whole documents of about R positions together (a longer one alone), since no query reads
// another document's keys; a row of one document is one chunk (`split_plain`: tiles of R
// positions, for the forward, whose query tiles never share an output). More chunks than rows
// keep the threads busy when a rank's few packed rows hold many documents.
std::vector<Chunk> chunks(const int32_t* doc_start, int64_t B, int64_t T_, int64_t R,
                          bool split_plain) {
  std::vector<Chunk> v;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* ds = doc_start ? doc_start + b * T_ : nullptr;
    if (!ds) {
      for (int64_t t = 0; t < T_; t += split_plain ? R : T_)
        v.push_back({b, t, split_plain ? std::min(T_, t + R) : T_});
      continue;
    }
    for (int64_t c0 = 0; c0 < T_;) {
      int64_t c1 = c0 + 1;  // past the documents that start before c0 + R
      while (c1 < T_ && (ds[c1] != c1 || c1 < c0 + R)) ++c1;
      v.push_back({b, c0, c1});
      c0 = c1;
    }
  }
  return v;
}

}  // namespace

int64_t attention_scratch_bytes(bool backward, int64_t T_, int64_t elem_bytes) {
  return per_thread_scratch(backward, T_) * int64_t(std::max(1, omp_get_max_threads())) *
         elem_bytes;
}

// Query rows in tiles of kRows: S = scale Q_tile K^T over the keys the tile may see (all, or from
// its document's start up to its last row when causal), a row softmax, then O_tile = P V.
template <class T>
void attention_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t T_, int64_t H, int64_t KV,
                       int64_t hd, bool causal, const int32_t* doc_start, int64_t window) {
  const int64_t d = H * hd, ld = (H + 2 * KV) * hd, R = std::min(kRows, T_), group = H / KV;
  // A window's tiles are at most a window of rows (their keys: two windows), at least 32 (a GEMM
  // of one row per head is all overhead; the rows' masks keep each to its window).
  FSDP_CHECK(window == 0 || causal, "[attention] a sliding window needs causal attention");
  const int64_t Rt = window > 0 ? std::min(R, std::max<int64_t>(window, 32)) : R;
  const T scale = T(1) / std::sqrt(T(hd));
  std::vector<T> scratch = thread_scratch<T>("attention", per_thread_scratch(false, T_), T_);
  const std::vector<Chunk> work = chunks(doc_start, B, T_, R, true);
  const int64_t tasks = int64_t(work.size()) * H;
#pragma omp parallel
  {
    T* s = scratch.data() + size_t(omp_get_thread_num()) * size_t(R * T_);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const Chunk& c = work[size_t(task / H)];
      const int64_t b = c.b, h = task % H;
      const T* q = qkv + b * T_ * ld + h * hd;
      const T* k = qkv + b * T_ * ld + d + (h / group) * hd;
      const T* v = k + KV * hd;
      auto tile = [&](int64_t i0, int64_t rows, int64_t j0) {
        if (window > 0) j0 = std::max(j0, i0 - window + 1);  // keys before the window: skipped
        const int64_t nk = (causal ? i0 + rows : T_) - j0;
        gemm<T>(false, true, rows, nk, hd, scale, q + i0 * ld, ld, k + j0 * ld, ld, T(0), s, nk);
        for (int64_t r = 0; r < rows; ++r) {
          T* row = s + r * nk;
          // Row r sees keys [lo, n) of the tile's: its document's and window's, up to itself.
          const int64_t n = causal ? i0 + r + 1 - j0 : nk;
          const int64_t lo = window > 0 ? std::max<int64_t>(0, i0 + r - window + 1 - j0) : 0;
          T m = -std::numeric_limits<T>::infinity();
          for (int64_t j = lo; j < n; ++j) m = std::max(m, row[j]);
          T sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = lo; j < n; ++j) {
            row[j] = vexp(row[j] - m);
            sum += row[j];
          }
          const T inv = T(1) / sum;
#pragma omp simd
          for (int64_t j = lo; j < n; ++j) row[j] *= inv;
          for (int64_t j = 0; j < lo; ++j) row[j] = T(0);
          for (int64_t j = n; j < nk; ++j) row[j] = T(0);
          lse[(b * H + h) * T_ + i0 + r] = m + std::log(sum);
        }
        gemm<T>(false, false, rows, hd, nk, T(1), s, nk, v + j0 * ld, ld, T(0),
                out + (b * T_ + i0) * d + h * hd, d);
      };
      for_each_tile(doc_start ? doc_start + b * T_ : nullptr, c.begin, c.end, Rt, tile);
    }
  }
}

// The same tiles in the backward: P from the saved lse, then per tile dV += P^T dO,
// dS = P (dO V^T - rowdot), dQ_tile = scale dS K, dK += scale dS^T Q_tile. One (b, kv head) per
// task, the query heads of its group and their tiles in order, so dK and dV sum over the group
// without races.
template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv, int64_t B,
                        int64_t T_, int64_t H, int64_t KV, int64_t hd, bool causal,
                        const int32_t* doc_start, int64_t window) {
  const int64_t d = H * hd, ld = (H + 2 * KV) * hd, R = std::min(kRows, T_), group = H / KV;
  FSDP_CHECK(window == 0 || causal, "[attention_backward] a sliding window needs causal attention");
  const int64_t Rt = window > 0 ? std::min(R, std::max<int64_t>(window, 32)) : R;
  const T scale = T(1) / std::sqrt(T(hd));
  std::vector<T> scratch =
      thread_scratch<T>("attention_backward", per_thread_scratch(true, T_), T_);
  // Chunks of whole documents (a row of one: the row) own their keys' dK and dV: no races.
  const std::vector<Chunk> work = chunks(doc_start, B, T_, R, false);
  const int64_t tasks = int64_t(work.size()) * KV;
#pragma omp parallel
  {
    T* p = scratch.data() + size_t(omp_get_thread_num()) * size_t(2 * R * T_ + R);
    T* dp = p + R * T_;
    T* rowdot = dp + R * T_;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const Chunk& c = work[size_t(task / KV)];
      const int64_t b = c.b, g = task % KV;
      const T* k = qkv + b * T_ * ld + d + g * hd;
      const T* v = k + KV * hd;
      T* dk = dqkv + b * T_ * ld + d + g * hd;
      T* dv = dk + KV * hd;
      for (int64_t j = c.begin; j < c.end; ++j)
        for (int64_t e = 0; e < hd; ++e) dk[j * ld + e] = dv[j * ld + e] = T(0);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const T* q = qkv + b * T_ * ld + h * hd;
        const T* o = out + b * T_ * d + h * hd;
        const T* dO = dout + b * T_ * d + h * hd;
        const T* l = lse + (b * H + h) * T_;
        T* dq = dqkv + b * T_ * ld + h * hd;
        auto tile = [&](int64_t i0, int64_t rows, int64_t j0) {
          if (window > 0) j0 = std::max(j0, i0 - window + 1);
          const int64_t nk = (causal ? i0 + rows : T_) - j0;
          const T* kt = k + j0 * ld;
          const T* vt = v + j0 * ld;
          // P = exp(scale * q k^T - lse), zero above the diagonal when causal and before the
          // window.
          gemm<T>(false, true, rows, nk, hd, scale, q + i0 * ld, ld, kt, ld, T(0), p, nk);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = i0 + r, n = causal ? i + 1 - j0 : nk;
            const int64_t lo = window > 0 ? std::max<int64_t>(0, i - window + 1 - j0) : 0;
            T* row = p + r * nk;
            for (int64_t j = 0; j < lo; ++j) row[j] = T(0);
#pragma omp simd
            for (int64_t j = lo; j < n; ++j) row[j] = vexp(row[j] - l[i]);
            for (int64_t j = n; j < nk; ++j) row[j] = T(0);
            T acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t e = 0; e < hd; ++e) acc += dO[i * d + e] * o[i * d + e];
            rowdot[r] = acc;
          }
          // dV += P^T dO ; dP = dO V^T
          gemm<T>(true, false, nk, hd, rows, T(1), p, nk, dO + i0 * d, d, T(1), dv + j0 * ld, ld);
          gemm<T>(false, true, rows, nk, hd, T(1), dO + i0 * d, d, vt, ld, T(0), dp, nk);
          // dS = P * (dP - rowdot), kept in dp
          for (int64_t r = 0; r < rows; ++r) {
            T* dr = dp + r * nk;
            const T* pr = p + r * nk;
#pragma omp simd
            for (int64_t j = 0; j < nk; ++j) dr[j] = pr[j] * (dr[j] - rowdot[r]);
          }
          // dQ = scale dS K ; dK += scale dS^T Q
          gemm<T>(false, false, rows, hd, nk, scale, dp, nk, kt, ld, T(0), dq + i0 * ld, ld);
          gemm<T>(true, false, nk, hd, rows, scale, dp, nk, q + i0 * ld, ld, T(1), dk + j0 * ld,
                  ld);
        };
        for_each_tile(doc_start ? doc_start + b * T_ : nullptr, c.begin, c.end, Rt, tile);
      }
    }
  }
}

#define FSDP_INSTANTIATE(T)                                                                     \
  template void attention_forward<T>(const T*, T*, T*, int64_t, int64_t, int64_t, int64_t,      \
                                     int64_t, bool, const int32_t*, int64_t);                   \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, T*, int64_t,      \
                                      int64_t, int64_t, int64_t, int64_t, bool, const int32_t*, \
                                      int64_t);
FSDP_INSTANTIATE(float)
FSDP_INSTANTIATE(double)
#undef FSDP_INSTANTIATE

}  // namespace fsdp::kernels::cpu

namespace fsdp::kernels::cpu {

template <class T>
void attention_decode(const T* q, const T* k, const T* v, T* out, int64_t n, int64_t H, int64_t KV,
                      int64_t hd, int64_t past, int64_t window) {
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
        const int64_t lo = window > 0 ? std::max<int64_t>(0, keys - window) : 0;  // its window
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = lo; j < keys; ++j) {
          const T* kj = k + j * dkv + (h / group) * hd;
          T s = 0;
          for (int64_t c = 0; c < hd; ++c) s += qi[c] * kj[c];
          p[size_t(j)] = s * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        T sum = 0;
        for (int64_t j = lo; j < keys; ++j) sum += p[size_t(j)] = std::exp(p[size_t(j)] - mx);
        T* o = out + i * d + h * hd;
        for (int64_t c = 0; c < hd; ++c) o[c] = 0;
        for (int64_t j = lo; j < keys; ++j) {
          const T w = p[size_t(j)] / sum;
          const T* vj = v + j * dkv + (h / group) * hd;
          for (int64_t c = 0; c < hd; ++c) o[c] += w * vj[c];
        }
      }
  }
}

template void attention_decode<float>(const float*, const float*, const float*, float*, int64_t,
                                      int64_t, int64_t, int64_t, int64_t, int64_t);
template void attention_decode<double>(const double*, const double*, const double*, double*,
                                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);

}  // namespace fsdp::kernels::cpu
