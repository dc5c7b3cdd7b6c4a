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

// The index math in I: 32-bit unsigned where every element of qkv has a 32-bit index (a 32-bit
// division is a few instructions, a 64-bit one dozens, and there are three per element), 64-bit
// past that. The arithmetic on the values is the same either way.
template <class T, class I>
__global__ void rope_kernel(T* __restrict__ qkv, I B, I Tn, I H, I KV, I hd, int64_t offset,
                            const int32_t* __restrict__ doc_start, RopeFreqs freqs, float sign) {
  const I half = hd / 2, heads = H + KV, n = B * Tn * heads * half;
  for (I idx = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); idx < n;
       idx += I(gridDim.x) * I(blockDim.x)) {
    const I i = idx % half;
    const I h = (idx / half) % heads;  // q heads, then k heads
    const I bt = idx / (half * heads);
    const I t = bt % Tn;
    T* x = qkv + bt * (H + 2 * KV) * hd + h * hd;
    // packed: from its document
    const int64_t pos = doc_start ? int64_t(t) - doc_start[bt] : int64_t(t) + offset;
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
  // 32-bit indices where qkv has under 2^31 elements: an index below that plus the grid's stride
  // (at most 65535 blocks of 256) stays under 2^32, so no unsigned sum wraps.
  const bool narrow = B * T * (H + 2 * KV) * hd < (int64_t(1) << 31);
  dispatch_float(t, "rope", [&](auto tv) {
    using TT = decltype(tv);
    TT* x = static_cast<TT*>(qkv);
    const float sign = inverse ? -1.f : 1.f;
    if (narrow)
      rope_kernel<TT, uint32_t><<<grid_for(n, 256), 256, 0, cudaStream_t(s)>>>(
          x, uint32_t(B), uint32_t(T), uint32_t(H), uint32_t(KV), uint32_t(hd), offset, doc_start,
          f, sign);
    else
      rope_kernel<TT, int64_t><<<grid_for(n, 256), 256, 0, cudaStream_t(s)>>>(
          x, B, T, H, KV, hd, offset, doc_start, f, sign);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
