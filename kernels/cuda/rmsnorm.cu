// RMSNorm on the device, the same formulas as kernels/cpu/rmsnorm.cpp. The
// forward is one block per row, f32 sums. The backward reads dy and x once
// for both gradients: about two blocks per SM walk the rows, each writing dx
// and keeping its share of dw per column in shared memory; a second small
// kernel adds the blocks' shares into dw in a fixed order (deterministic, no
// atomics). Its floor is the bytes of dy, x and dx (the first version kept
// one thread per column looping over all rows: 8 blocks on the whole GPU).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

// Both kernels take a row N columns a thread-step: 16-byte loads and stores where dim is a
// multiple of N and every pointer is aligned to N elements (then so is each row), one column
// elsewhere.
template <int N, class T>
__global__ void rmsnorm_fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                            float* __restrict__ rstd, int64_t dim, float eps, float w_offset) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * dim;
  const int64_t first = int64_t(threadIdx.x) * N, step = int64_t(blockDim.x) * N;
  float ss = 0.f;
  for (int64_t c = first; c < dim; c += step) {
    float v[N];
    load_f32<N>(xr + c, v);
#pragma unroll
    for (int k = 0; k < N; ++k) ss += v[k] * v[k];
  }
  ss = block_sum(ss);
  const float rs = rsqrtf(ss / float(dim) + eps);
  if (threadIdx.x == 0) rstd[row] = rs;
  for (int64_t c = first; c < dim; c += step) {
    float v[N], wv[N];
    load_f32<N>(xr + c, v);
    load_f32<N>(w + c, wv);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = v[k] * rs * (wv[k] + w_offset);
    store_f32<N>(y + row * dim + c, v);
  }
}

// dx of each row, and this block's share of dw. A block walks rows blockIdx.x, blockIdx.x +
// gridDim.x, ...; each thread owns the columns threadIdx.x * N + k * blockDim.x * N (and the N
// after each), the same in every loop here, so its dw sums live in shared memory with no atomics
// and no barrier, and the block writes them once to partial[blockIdx.x]. dy and x are read once
// for both gradients.
template <int N, class T>
__global__ void rmsnorm_bwd(const T* __restrict__ dy, const T* __restrict__ x,
                            const T* __restrict__ w, const float* __restrict__ rstd,
                            T* __restrict__ dx, float* __restrict__ partial, int64_t rows,
                            int64_t dim, float w_offset) {
  extern __shared__ __align__(16) float dw_acc[];  // [dim] when partial, else unused
  const int64_t first = int64_t(threadIdx.x) * N, step = int64_t(blockDim.x) * N;
  if (partial)
    for (int64_t c = first; c < dim; c += step)
#pragma unroll
      for (int k = 0; k < N; ++k) dw_acc[c + k] = 0.f;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * dim;
    const T* dyr = dy + row * dim;
    const float rs = rstd[row];
    float dot = 0.f;
    for (int64_t c = first; c < dim; c += step) {
      float g[N], wv[N], xv[N];
      load_f32<N>(dyr + c, g);
      load_f32<N>(w + c, wv);
      load_f32<N>(xr + c, xv);
#pragma unroll
      for (int k = 0; k < N; ++k) dot += g[k] * (wv[k] + w_offset) * xv[k];
    }
    dot = block_sum(dot);  // (its barriers also order this row's reads after the last row's)
    const float kk = dot * rs * rs / float(dim);
    for (int64_t c = first; c < dim; c += step) {
      float g[N], wv[N], xv[N], d[N];
      load_f32<N>(dyr + c, g);
      load_f32<N>(w + c, wv);
      load_f32<N>(xr + c, xv);
#pragma unroll
      for (int k = 0; k < N; ++k) d[k] = rs * (g[k] * (wv[k] + w_offset) - xv[k] * kk);
      store_f32<N>(dx + row * dim + c, d);
      if (!partial) continue;
      if constexpr (N % 4 == 0) {  // 16-byte shared accesses: no N-way bank conflicts
        float4* acc = reinterpret_cast<float4*>(dw_acc + c);
#pragma unroll
        for (int q = 0; q < N / 4; ++q) {
          float4 a = acc[q];
          a.x += g[4 * q] * xv[4 * q] * rs;
          a.y += g[4 * q + 1] * xv[4 * q + 1] * rs;
          a.z += g[4 * q + 2] * xv[4 * q + 2] * rs;
          a.w += g[4 * q + 3] * xv[4 * q + 3] * rs;
          acc[q] = a;
        }
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) dw_acc[c + k] += g[k] * xv[k] * rs;
      }
    }
  }
  if (partial)
    for (int64_t c = first; c < dim; c += step)
#pragma unroll
      for (int k = 0; k < N; ++k) partial[int64_t(blockIdx.x) * dim + c + k] = dw_acc[c + k];
}

// dw[c] += sum over blocks of partial[b][c], in block order (deterministic).
template <class G>
__global__ void rmsnorm_dw_finish(const float* __restrict__ partial, G* __restrict__ dw,
                                  int64_t blocks, int64_t dim) {
  GRID_STRIDE(c, dim) {
    float acc = 0.f;
    for (int64_t b = 0; b < blocks; ++b) acc += partial[b * dim + c];
    dw[c] = from_f32<G>(to_f32(dw[c]) + acc);
  }
}

namespace {
// The f32 dw sums in shared memory: 160 KiB at most, within sm_80's and sm_90's limits.
constexpr int kMaxDwDim = 40 * 1024;

int64_t dw_blocks(int64_t rows, int device) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return std::max<int64_t>(1, std::min<int64_t>(rows, 2 * int64_t(sms)));
}
}  // namespace

int64_t rmsnorm_backward_scratch(int64_t rows, int64_t dim, int device) {
  return rows == 0 ? 0 : dw_blocks(rows, device) * dim;
}

void rmsnorm_forward(const void* x, const void* w, void* y, float* rstd, DType t, int64_t rows,
                     int64_t dim, double eps, float w_offset, int device, Stream s) {
  if (rows == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "rmsnorm", [&](auto tv) {
    using T = decltype(tv);
    constexpr int N = vec_elems<T>();
    const T* px = static_cast<const T*>(x);
    const T* pw = static_cast<const T*>(w);
    T* py = static_cast<T*>(y);
    auto kernel = dim % N == 0 && vec_aligned<N>(px) && vec_aligned<N>(pw) && vec_aligned<N>(py)
                      ? rmsnorm_fwd<N, T>
                      : rmsnorm_fwd<1, T>;
    kernel<<<unsigned(rows), 256, 0, cudaStream_t(s)>>>(px, pw, py, rstd, dim, float(eps),
                                                        w_offset);
  });
  CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_backward(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                      void* dw, DType dwt, float* scratch, DType t, int64_t rows, int64_t dim,
                      float w_offset, int device, Stream s) {
  if (rows == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  FSDP_CHECK(!dw || dim <= kMaxDwDim, "[rmsnorm_backward] CUDA dw takes dims up to {}, got {}",
             kMaxDwDim, dim);
  const int64_t blocks = dw ? dw_blocks(rows, device) : std::min<int64_t>(rows, 1 << 20);
  const size_t smem = dw ? size_t(dim) * sizeof(float) : 0;
  dispatch_float(t, "rmsnorm_backward", [&](auto tv) {
    using T = decltype(tv);
    constexpr int N = vec_elems<T>();
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    const T* pw = static_cast<const T*>(w);
    T* pdx = static_cast<T*>(dx);
    auto kernel = dim % N == 0 && vec_aligned<N>(pdy) && vec_aligned<N>(px) && vec_aligned<N>(pw) &&
                          vec_aligned<N>(pdx)
                      ? rmsnorm_bwd<N, T>
                      : rmsnorm_bwd<1, T>;
    if (smem > 48 * 1024)
      CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kernel<<<unsigned(blocks), 256, smem, cudaStream_t(s)>>>(
        pdy, px, pw, rstd, pdx, dw ? scratch : nullptr, rows, dim, w_offset);
  });
  CUDA_CHECK(cudaGetLastError());
  if (dw) {
    dispatch_float(dwt, "rmsnorm_backward", [&](auto gv) {
      using G = decltype(gv);
      rmsnorm_dw_finish<G><<<grid_for(dim, 256), 256, 0, cudaStream_t(s)>>>(
          scratch, static_cast<G*>(dw), blocks, dim);
    });
    CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace fsdp::kernels::cuda
