// Random fills and FSDP's segment copies on the device (grid-stride); the plain casts and
// fills are core's (src/core/cuda/cast_fill.cu).
#include <algorithm>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

// A counter-based hash (splitmix64) of (seed, i) to [0, 1).
template <class T>
__global__ void fill_uniform_kernel(T* __restrict__ dst, double lo, double hi, uint64_t seed,
                                    int64_t n) {
  GRID_STRIDE(i, n) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + uint64_t(i) + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = double(z >> 11) * 0x1.0p-53;
    dst[i] = convert<T>(lo + (hi - lo) * u);
  }
}

// One block row per segment; threads stride over the segment's elements, N at a time (16-byte
// accesses where every offset and count is a multiple of N and both buffers are aligned to it).
template <int N, class D, class S>
__global__ void copy_segments_kernel(D* __restrict__ dst, const S* __restrict__ src,
                                     const int64_t* __restrict__ dst_off,
                                     const int64_t* __restrict__ src_off,
                                     const int64_t* __restrict__ count) {
  const int64_t seg = blockIdx.y;
  const int64_t n = count[seg];
  D* d = dst + dst_off[seg];
  const S* s = src + src_off[seg];
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n / N;
       j += int64_t(gridDim.x) * blockDim.x) {
    const Pack<S, N> in = *reinterpret_cast<const Pack<S, N>*>(s + j * N);
    Pack<D, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = convert<D>(in.v[k]);
    *reinterpret_cast<Pack<D, N>*>(d + j * N) = out;
  }
}

void fill_uniform(void* dst, DType t, int64_t n, double lo, double hi, uint64_t seed, int device,
                  Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "fill_uniform", [&](auto tv) {
    using T = decltype(tv);
    fill_uniform_kernel<T>
        <<<grid_for(n, 256), 256, 0, cudaStream_t(s)>>>(static_cast<T*>(dst), lo, hi, seed, n);
  });
  CUDA_CHECK(cudaGetLastError());
}

void copy_segments(void* dst, DType dst_t, const void* src, DType src_t, const int64_t* dst_off,
                   const int64_t* src_off, const int64_t* count, int64_t segments, int device,
                   Stream s) {
  if (segments == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  // The offsets travel in one small device buffer from the caching allocator.
  int64_t longest = 0;
  for (int64_t i = 0; i < segments; ++i) longest = std::max(longest, count[i]);
  Scratch scratch(size_t(3 * segments) * sizeof(int64_t), device);
  int64_t* meta = scratch.as<int64_t>();
  std::vector<int64_t> host(size_t(3 * segments));
  std::copy(dst_off, dst_off + segments, host.begin());
  std::copy(src_off, src_off + segments, host.begin() + segments);
  std::copy(count, count + segments, host.begin() + 2 * segments);
  CUDA_CHECK(cudaMemcpyAsync(meta, host.data(), host.size() * sizeof(int64_t),
                             cudaMemcpyHostToDevice, cudaStream_t(s)));
  // From pageable memory, cudaMemcpyAsync returns once `host` is staged, so it may go now.
  dispatch_device(dst_t, [&](auto dv) {
    using D = decltype(dv);
    dispatch_device(src_t, [&](auto sv) {
      using S = decltype(sv);
      constexpr int N = vec_elems<D, S>();
      D* d = static_cast<D*>(dst);
      const S* sp = static_cast<const S*>(src);
      bool packed = vec_aligned<N>(d) && vec_aligned<N>(sp);
      for (int64_t i = 0; packed && i < segments; ++i)
        packed = dst_off[i] % N == 0 && src_off[i] % N == 0 && count[i] % N == 0;
      const int w = packed ? N : 1;
      auto kernel = packed ? copy_segments_kernel<N, D, S> : copy_segments_kernel<1, D, S>;
      // A segment a row of the grid, at most 65535 rows a launch (gridDim.y's limit: an MoE's
      // permutation is a segment per (token, choice) row).
      constexpr int64_t kMaxRows = 65535;
      for (int64_t first = 0; first < segments; first += kMaxRows) {
        const dim3 grid(grid_for((longest + w - 1) / w, 256, 1024),
                        unsigned(std::min(kMaxRows, segments - first)));
        kernel<<<grid, 256, 0, cudaStream_t(s)>>>(d, sp, meta + first, meta + segments + first,
                                                  meta + 2 * segments + first);
      }
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
