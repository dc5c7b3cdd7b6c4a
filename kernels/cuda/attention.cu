// Flash-style attention on the device: no T x T matrix ever reaches HBM.
// Each warp owns one row (a query in the forward and for dq, a key for dk and
// dv); the warps of a block share tiles of the other side's rows, staged in
// shared memory. The forward keeps a running max and sum (online softmax) and
// stores only the row's log-sum-exp; the backward recomputes the
// probabilities from it, in two passes that need no atomics (dq by query
// rows, dk and dv by key rows). Scores are dot products reduced across the
// warp, so this is the simple version: correct for any T and head dims up to
// 256, without the tensor-core tiling of FlashAttention-2. Grouped-query
// attention: qkv rows hold H query heads, then KV key heads, then KV value
// heads; query head h reads kv head h / (H / KV), and the dk/dv pass runs one
// block per kv head, over the query heads of its group in turn. Packed rows (doc_start, causal):
// a query sees only its document's keys; the key tiles before a block's first document and the
// query tiles after its last are skipped, the rest masked per pair.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

namespace {

constexpr int kWarps = 8, kTile = 16, kMaxD = 256, kPerLane = kMaxD / 32;

struct Dims {
  int64_t B, T, H, KV, hd;
};

// Part 0 (q) of query head h, or part 1 (k) / 2 (v) of kv head h, at position t.
template <class T>
__device__ __forceinline__ T* qkv_row(T* qkv, const Dims& d, int64_t b, int64_t t, int part,
                                      int64_t h) {
  return qkv + (b * d.T + t) * (d.H + 2 * d.KV) * d.hd +
         (part == 0 ? h : d.H + (part - 1) * d.KV + h) * d.hd;
}

template <class T>
__device__ __forceinline__ void load_row(float (&r)[kPerLane], const T* p, int64_t hd, int lane,
                                         float mul = 1.f) {
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int64_t c = lane + 32 * u;
    r[u] = c < hd ? to_f32(p[c]) * mul : 0.f;
  }
}

__device__ __forceinline__ float dot_row(const float (&r)[kPerLane], const float* s, int64_t hd,
                                         int lane) {
  float acc = 0.f;
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int64_t c = lane + 32 * u;
    if (c < hd) acc += r[u] * s[c];
  }
  return warp_sum(acc);
}

// Stages rows [j0, j0 + kTile) of two row sources into shared memory.
template <class T, class RowA, class RowB>
__device__ __forceinline__ void stage(float (*sa)[kMaxD], float (*sb)[kMaxD], int64_t j0,
                                      int64_t limit, int64_t hd, RowA row_a, RowB row_b) {
  for (int64_t e = threadIdx.x; e < kTile * hd; e += blockDim.x) {
    const int64_t jj = e / hd, c = e % hd, j = j0 + jj;
    sa[jj][c] = j < limit ? to_f32(row_a(j)[c]) : 0.f;
    sb[jj][c] = j < limit ? to_f32(row_b(j)[c]) : 0.f;
  }
}

// The keys a query row of a block may see (packed rows: from its document's start; a window:
// from t - window + 1): `own`, this warp's query's first key, and `block_from`, the first key of
// any query in the block (its first query's; documents start in order). A doc_start the host did
// not check is clamped, so it never reads before the row.
struct KeyRange {
  int64_t own, block_from;
};
__device__ __forceinline__ KeyRange key_range(const int32_t* __restrict__ doc_start, const Dims& d,
                                              int64_t b, int64_t i, bool valid, int64_t window) {
  const int64_t i0 = int64_t(blockIdx.y) * kWarps;  // the block's first query
  const int64_t first = doc_start ? max(int64_t(0), int64_t(doc_start[b * d.T + i0])) : 0;
  const int64_t own = max(doc_start && valid ? int64_t(doc_start[b * d.T + i]) : int64_t(0),
                          window > 0 ? i - window + 1 : int64_t(0));
  return {own, max(first, window > 0 ? i0 - window + 1 : int64_t(0))};
}

template <class T>
__global__ void attn_fwd(const T* __restrict__ qkv, T* __restrict__ out, float* __restrict__ lse,
                         Dims d, bool causal, const int32_t* __restrict__ doc_start, int64_t window,
                         float scale) {
  __shared__ float sk[kTile][kMaxD], sv[kTile][kMaxD];
  const int64_t b = blockIdx.x / d.H, h = blockIdx.x % d.H, g = h / (d.H / d.KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = int64_t(blockIdx.y) * kWarps + warp;
  const bool valid = i < d.T;
  float q[kPerLane], acc[kPerLane] = {0};
  if (valid) load_row(q, qkv_row(qkv, d, b, i, 0, h), d.hd, lane, scale);
  float m = -INFINITY, l = 0.f;
  const int64_t end = causal ? min(d.T, (int64_t(blockIdx.y) + 1) * kWarps) : d.T;
  const KeyRange keys = key_range(doc_start, d, b, i, valid, window);
  const int64_t own = keys.own;
  for (int64_t j0 = keys.block_from / kTile * kTile; j0 < end; j0 += kTile) {
    __syncthreads();
    stage<T>(
        sk, sv, j0, d.T, d.hd, [&](int64_t j) { return qkv_row(qkv, d, b, j, 1, g); },
        [&](int64_t j) { return qkv_row(qkv, d, b, j, 2, g); });
    __syncthreads();
    if (!valid) continue;
    for (int jj = 0; jj < kTile; ++jj) {
      const int64_t j = j0 + jj;
      if (j >= d.T || (causal && j > i)) break;
      if (j < own) continue;  // another document's key, or one before the window
      const float s = dot_row(q, sk[jj], d.hd, lane);
      const float m_new = fmaxf(m, s), corr = __expf(m - m_new), p = __expf(s - m_new);
      l = l * corr + p;
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int64_t c = lane + 32 * u;
        acc[u] = acc[u] * corr + (c < d.hd ? p * sv[jj][c] : 0.f);
      }
      m = m_new;
    }
  }
  if (!valid) return;
  T* o = out + (b * d.T + i) * d.H * d.hd + h * d.hd;
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int64_t c = lane + 32 * u;
    if (c < d.hd) o[c] = from_f32<T>(acc[u] / l);
  }
  if (lane == 0) lse[(b * d.H + h) * d.T + i] = m + logf(l);
}

// D[i] = dO[i] . O[i], per (b, h, i).
template <class T>
__global__ void attn_rowdot(const T* __restrict__ dout, const T* __restrict__ out,
                            float* __restrict__ D, Dims d) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;  // over B * T * H
  const int lane = threadIdx.x % 32;
  if (row >= d.B * d.T * d.H) return;
  const int64_t h = row % d.H, bt = row / d.H, b = bt / d.T, t = bt % d.T;
  const T* a = dout + bt * d.H * d.hd + h * d.hd;
  const T* o = out + bt * d.H * d.hd + h * d.hd;
  float acc = 0.f;
  for (int64_t c = lane; c < d.hd; c += 32) acc += to_f32(a[c]) * to_f32(o[c]);
  acc = warp_sum(acc);
  if (lane == 0) D[(b * d.H + h) * d.T + t] = acc;
}

template <class T>
__global__ void attn_bwd_dq(const T* __restrict__ dout, const T* __restrict__ qkv,
                            const float* __restrict__ lse, const float* __restrict__ D,
                            T* __restrict__ dqkv, Dims d, bool causal,
                            const int32_t* __restrict__ doc_start, int64_t window, float scale) {
  __shared__ float sk[kTile][kMaxD], sv[kTile][kMaxD];
  const int64_t b = blockIdx.x / d.H, h = blockIdx.x % d.H, g = h / (d.H / d.KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = int64_t(blockIdx.y) * kWarps + warp;
  const bool valid = i < d.T;
  float q[kPerLane], go[kPerLane], dq[kPerLane] = {0};
  float li = 0.f, Di = 0.f;
  if (valid) {
    load_row(q, qkv_row(qkv, d, b, i, 0, h), d.hd, lane, scale);
    load_row(go, dout + (b * d.T + i) * d.H * d.hd + h * d.hd, d.hd, lane);
    li = lse[(b * d.H + h) * d.T + i];
    Di = D[(b * d.H + h) * d.T + i];
  }
  const int64_t end = causal ? min(d.T, (int64_t(blockIdx.y) + 1) * kWarps) : d.T;
  const KeyRange keys = key_range(doc_start, d, b, i, valid, window);
  const int64_t own = keys.own;
  for (int64_t j0 = keys.block_from / kTile * kTile; j0 < end; j0 += kTile) {
    __syncthreads();
    stage<T>(
        sk, sv, j0, d.T, d.hd, [&](int64_t j) { return qkv_row(qkv, d, b, j, 1, g); },
        [&](int64_t j) { return qkv_row(qkv, d, b, j, 2, g); });
    __syncthreads();
    if (!valid) continue;
    for (int jj = 0; jj < kTile; ++jj) {
      const int64_t j = j0 + jj;
      if (j >= d.T || (causal && j > i)) break;
      if (j < own) continue;
      const float p = __expf(dot_row(q, sk[jj], d.hd, lane) - li);
      const float ds = p * (dot_row(go, sv[jj], d.hd, lane) - Di);
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int64_t c = lane + 32 * u;
        if (c < d.hd) dq[u] += ds * sk[jj][c];
      }
    }
  }
  if (!valid) return;
  T* o = qkv_row(dqkv, d, b, i, 0, h);
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int64_t c = lane + 32 * u;
    if (c < d.hd) o[c] = from_f32<T>(dq[u] * scale);
  }
}

template <class T>
__global__ void attn_bwd_dkdv(const T* __restrict__ dout, const T* __restrict__ qkv,
                              const float* __restrict__ lse, const float* __restrict__ D,
                              T* __restrict__ dqkv, Dims d, bool causal,
                              const int32_t* __restrict__ doc_start, int64_t window, float scale) {
  __shared__ float sq[kTile][kMaxD], sdo[kTile][kMaxD];
  __shared__ float slse[kTile], sD[kTile];
  __shared__ int32_t sds[kTile];
  const int64_t b = blockIdx.x / d.KV, g = blockIdx.x % d.KV, group = d.H / d.KV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j = int64_t(blockIdx.y) * kWarps + warp;  // this warp's key row
  const bool valid = j < d.T;
  float k[kPerLane], v[kPerLane], dk[kPerLane] = {0}, dv[kPerLane] = {0};
  if (valid) {
    load_row(k, qkv_row(qkv, d, b, j, 1, g), d.hd, lane, scale);
    load_row(v, qkv_row(qkv, d, b, j, 2, g), d.hd, lane);
  }
  const int64_t begin = causal ? (int64_t(blockIdx.y) * kWarps) / kTile * kTile : 0;
  // Packed: no query after the block's last key's document reads any of its keys.
  const int64_t last_key = min(d.T - 1, (int64_t(blockIdx.y) + 1) * kWarps - 1);
  for (int64_t h = g * group; h < (g + 1) * group; ++h)  // the query heads that read this kv head
    for (int64_t i0 = begin; i0 < d.T; i0 += kTile) {
      if (doc_start && doc_start[b * d.T + i0] > last_key) break;  // the same for the whole block
      if (window > 0 && i0 > last_key + window - 1) break;         // past every key's window
      __syncthreads();
      stage<T>(
          sq, sdo, i0, d.T, d.hd, [&](int64_t i) { return qkv_row(qkv, d, b, i, 0, h); },
          [&](int64_t i) { return dout + (b * d.T + i) * d.H * d.hd + h * d.hd; });
      if (threadIdx.x < kTile) {
        const int64_t i = i0 + threadIdx.x;
        slse[threadIdx.x] = i < d.T ? lse[(b * d.H + h) * d.T + i] : 0.f;
        sD[threadIdx.x] = i < d.T ? D[(b * d.H + h) * d.T + i] : 0.f;
        sds[threadIdx.x] = doc_start && i < d.T ? doc_start[b * d.T + i] : 0;
      }
      __syncthreads();
      if (!valid) continue;
      for (int ii = 0; ii < kTile; ++ii) {
        const int64_t i = i0 + ii;
        if (i >= d.T) break;
        if (causal && i < j) continue;
        if (sds[ii] > j) continue;                    // a query of a later document
        if (window > 0 && i - j >= window) continue;  // this key is before its window
        const float p = __expf(dot_row(k, sq[ii], d.hd, lane) - slse[ii]);
        const float ds = p * (dot_row(v, sdo[ii], d.hd, lane) - sD[ii]);
#pragma unroll
        for (int u = 0; u < kPerLane; ++u) {
          const int64_t c = lane + 32 * u;
          if (c < d.hd) {
            dv[u] += p * sdo[ii][c];
            dk[u] += ds * sq[ii][c];
          }
        }
      }
    }
  if (!valid) return;
  T* ok = qkv_row(dqkv, d, b, j, 1, g);
  T* ov = qkv_row(dqkv, d, b, j, 2, g);
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int64_t c = lane + 32 * u;
    if (c < d.hd) {
      ok[c] = from_f32<T>(dk[u] * scale);
      ov[c] = from_f32<T>(dv[u]);
    }
  }
}

}  // namespace

void attention_forward(const void* qkv, void* out, float* lse, DType t, int64_t B, int64_t T,
                       int64_t H, int64_t KV, int64_t hd, bool causal, const int32_t* doc_start,
                       int64_t window, int device, Stream s) {
  FSDP_CHECK(window == 0 || causal, "[attention] a sliding window needs causal attention");
  FSDP_CHECK(hd <= kMaxD, "[attention] CUDA attention supports head dims up to {}, got {}", kMaxD,
             hd);
  if (B * T * H == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  const Dims d{B, T, H, KV, hd};
  const dim3 grid(unsigned(B * H), unsigned((T + kWarps - 1) / kWarps));
  dispatch_float(t, "attention", [&](auto tv) {
    using TT = decltype(tv);
    attn_fwd<TT><<<grid, 32 * kWarps, 0, cudaStream_t(s)>>>(
        static_cast<const TT*>(qkv), static_cast<TT*>(out), lse, d, causal, doc_start, window,
        1.f / sqrtf(float(hd)));
  });
  CUDA_CHECK(cudaGetLastError());
}

void attention_backward(const void* dout, const void* qkv, const void* out, const float* lse,
                        void* dqkv, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t hd, bool causal, const int32_t* doc_start, int64_t window,
                        int device, Stream s) {
  FSDP_CHECK(window == 0 || causal, "[attention_backward] a sliding window needs causal attention");
  FSDP_CHECK(hd <= kMaxD, "[attention_backward] CUDA attention supports head dims up to {}, got {}",
             kMaxD, hd);
  if (B * T * H == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  const Dims d{B, T, H, KV, hd};
  Scratch scratch(size_t(B * H * T) * sizeof(float), device);
  float* D = scratch.as<float>();
  const dim3 grid(unsigned(B * H), unsigned((T + kWarps - 1) / kWarps));
  const float scale = 1.f / sqrtf(float(hd));
  dispatch_float(t, "attention_backward", [&](auto tv) {
    using TT = decltype(tv);
    attn_rowdot<TT>
        <<<unsigned((B * T * H + kWarps - 1) / kWarps), 32 * kWarps, 0, cudaStream_t(s)>>>(
            static_cast<const TT*>(dout), static_cast<const TT*>(out), D, d);
    attn_bwd_dq<TT><<<grid, 32 * kWarps, 0, cudaStream_t(s)>>>(
        static_cast<const TT*>(dout), static_cast<const TT*>(qkv), lse, D, static_cast<TT*>(dqkv),
        d, causal, doc_start, window, scale);
    attn_bwd_dkdv<TT><<<dim3(unsigned(B * KV), grid.y), 32 * kWarps, 0, cudaStream_t(s)>>>(
        static_cast<const TT*>(dout), static_cast<const TT*>(qkv), lse, D, static_cast<TT*>(dqkv),
        d, causal, doc_start, window, scale);
  });
  CUDA_CHECK(cudaGetLastError());
}

// One block per (query i, head h): scores over keys lo .. past+i (lo: 0, or the window's first)
// in shared memory, p[j - lo], the block's max and sum, then each thread owns output columns and
// sums over the keys.
template <class T>
__global__ void attn_decode_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                   const T* __restrict__ v, T* __restrict__ out, int64_t H,
                                   int64_t KV, int64_t hd, int64_t past, int64_t window,
                                   float scale) {
  extern __shared__ float p[];
  const int64_t i = blockIdx.x / H, h = blockIdx.x % H, d = H * hd, keys = past + i + 1;
  const int64_t dkv = KV * hd, g = h / (H / KV);
  const int64_t lo = window > 0 ? max(int64_t(0), keys - window) : 0;  // the window's first key
  const T* qi = q + i * d + h * hd;
  float mx = -INFINITY;
  for (int64_t j = lo + threadIdx.x; j < keys; j += blockDim.x) {
    const T* kj = k + j * dkv + g * hd;
    float s = 0.f;
    for (int64_t c = 0; c < hd; ++c) s += to_f32(qi[c]) * to_f32(kj[c]);
    p[j - lo] = s * scale;
    mx = fmaxf(mx, p[j - lo]);
  }
  mx = block_max(mx);
  float sum = 0.f;
  for (int64_t j = lo + threadIdx.x; j < keys; j += blockDim.x)
    sum += p[j - lo] = __expf(p[j - lo] - mx);
  sum = block_sum(sum);  // (its barriers also order the writes of p before the reads below)
  for (int64_t c = threadIdx.x; c < hd; c += blockDim.x) {
    float o = 0.f;
    for (int64_t j = lo; j < keys; ++j) o += p[j - lo] * to_f32(v[j * dkv + g * hd + c]);
    out[i * d + h * hd + c] = from_f32<T>(o / sum);
  }
}

void attention_decode(const void* q, const void* k, const void* v, void* out, DType t, int64_t n,
                      int64_t H, int64_t KV, int64_t hd, int64_t past, int64_t window, int device,
                      Stream s) {
  if (n * H == 0) return;
  // Scores of the keys each query reads: all cached, or its window's (p[] is window-relative).
  const int64_t read = window > 0 && window < past + n ? window : past + n;
  const size_t smem = size_t(read) * sizeof(float);
  FSDP_CHECK(smem <= 48 * 1024,
             "[attention_decode] {} keys per query exceed the 48 KiB of shared memory scores",
             read);
  CUDA_CHECK(cudaSetDevice(device));
  const float scale = 1.f / sqrtf(float(hd));
  dispatch_float(t, "attention_decode", [&](auto tv) {
    using TT = decltype(tv);
    attn_decode_kernel<TT><<<unsigned(n * H), 128, smem, cudaStream_t(s)>>>(
        static_cast<const TT*>(q), static_cast<const TT*>(k), static_cast<const TT*>(v),
        static_cast<TT*>(out), H, KV, hd, past, window, scale);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
