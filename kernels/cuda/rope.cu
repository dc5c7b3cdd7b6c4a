// Rotary embedding on the device, in place on q and k of a packed qkv
// [B, T, H + 2 KV, hd] (the H query heads and the KV key heads are adjacent),
// half-split pairs as in kernels/cpu/rope.cpp; inverse is the backward. Packed rows (doc_start)
// restart the positions at each document.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

// The frequencies by value in the kernel's parameters (1 KB of the 4 KB they may hold).
struct RopeFreqs {
  float f[kMaxRopePairs];
};

template <class T>
__global__ void rope_kernel(T* __restrict__ qkv, int64_t B, int64_t Tn, int64_t H, int64_t KV,
                            int64_t hd, int64_t offset, const int32_t* __restrict__ doc_start,
                            RopeFreqs freqs, float sign) {
  const int64_t half = hd / 2, n = B * Tn * (H + KV) * half;
  GRID_STRIDE(idx, n) {
    const int64_t i = idx % half;
    const int64_t h = (idx / half) % (H + KV);  // q heads, then k heads
    const int64_t bt = idx / (half * (H + KV));
    const int64_t t = bt % Tn;
    T* x = qkv + bt * (H + 2 * KV) * hd + h * hd;
    const int64_t pos = doc_start ? t - doc_start[bt] : t + offset;  // packed: from its document
    const float ang = float(pos) * freqs.f[i];
    float sn, cs;
    sincosf(ang, &sn, &cs);  // not __sincosf: its error grows with the angle (long contexts)
    sn *= sign;
    const float x0 = to_f32(x[i]), x1 = to_f32(x[i + half]);
    x[i] = from_f32<T>(x0 * cs - x1 * sn);
    x[i + half] = from_f32<T>(x1 * cs + x0 * sn);
  }
}

void rope_qkv(void* qkv, DType t, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
              const double* freqs, bool inverse, int64_t offset, const int32_t* doc_start,
              int device, Stream s) {
  const int64_t n = B * T * (H + KV) * (hd / 2);
  if (n == 0) return;
  FSDP_CHECK(hd / 2 <= kMaxRopePairs, "[rope] head dim {} is over the kernel's {}", hd,
             2 * kMaxRopePairs);
  RopeFreqs f{};
  for (int64_t i = 0; i < hd / 2; ++i) f.f[i] = float(freqs[i]);
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "rope", [&](auto tv) {
    using TT = decltype(tv);
    rope_kernel<TT><<<grid_for(n, 256), 256, 0, cudaStream_t(s)>>>(
        static_cast<TT*>(qkv), B, T, H, KV, hd, offset, doc_start, f, inverse ? -1.f : 1.f);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
