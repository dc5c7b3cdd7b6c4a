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

template <class T>
__global__ void rmsnorm_fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                            float* __restrict__ rstd, int64_t dim, float eps, float w_offset) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * dim;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    const float v = to_f32(xr[c]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float rs = rsqrtf(ss / float(dim) + eps);
  if (threadIdx.x == 0) rstd[row] = rs;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x)
    y[row * dim + c] = from_f32<T>(to_f32(xr[c]) * rs * (to_f32(w[c]) + w_offset));
}

// dx of each row, and this block's share of dw. A block walks rows blockIdx.x, blockIdx.x +
// gridDim.x, ...; each thread owns the columns threadIdx.x + k * blockDim.x, so its dw sums live
// in shared memory with no atomics, and the block writes them once to partial[blockIdx.x]. dy
// and x are read once for both gradients.
template <class T>
__global__ void rmsnorm_bwd(const T* __restrict__ dy, const T* __restrict__ x,
                            const T* __restrict__ w, const float* __restrict__ rstd,
                            T* __restrict__ dx, float* __restrict__ partial, int64_t rows,
                            int64_t dim, float w_offset) {
  extern __shared__ float dw_acc[];  // [dim] when partial, else unused
  if (partial)
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) dw_acc[c] = 0.f;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * dim;
    const T* dyr = dy + row * dim;
    const float rs = rstd[row];
    float dot = 0.f;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x)
      dot += to_f32(dyr[c]) * (to_f32(w[c]) + w_offset) * to_f32(xr[c]);
    dot = block_sum(dot);  // (its barriers also order this row's reads after the last row's)
    const float k = dot * rs * rs / float(dim);
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      const float g = to_f32(dyr[c]), xv = to_f32(xr[c]);
      dx[row * dim + c] = from_f32<T>(rs * (g * (to_f32(w[c]) + w_offset) - xv * k));
      if (partial) dw_acc[c] += g * xv * rs;
    }
  }
  if (partial)
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x)
      partial[int64_t(blockIdx.x) * dim + c] = dw_acc[c];
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
    rmsnorm_fwd<T><<<unsigned(rows), 256, 0, cudaStream_t(s)>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), rstd, dim,
        float(eps), w_offset);
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
    if (smem > 48 * 1024)
      CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_bwd<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(smem)));
    rmsnorm_bwd<T><<<unsigned(blocks), 256, smem, cudaStream_t(s)>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(w), rstd,
        static_cast<T*>(dx), dw ? scratch : nullptr, rows, dim, w_offset);
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
