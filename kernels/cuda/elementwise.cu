// Elementwise kernels and reductions on the device, accumulating in f32.
#include <algorithm>
#include <cstdint>
#include <optional>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

// The elementwise kernels take N elements a thread-step: 16-byte loads and stores where
// launch_vec found every pointer aligned, one element (N = 1) elsewhere and on the tail.
template <int N, class T>
__global__ void add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                           int64_t n) {
  GRID_STRIDE(j, n / N) {
    float x[N], y[N];
    load_f32<N>(a + j * N, x);
    load_f32<N>(b + j * N, y);
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] += y[k];
    store_f32<N>(out + j * N, x);
  }
}

template <int N, class A, class B>
__global__ void add_inplace_kernel(A* __restrict__ a, const B* __restrict__ b, int64_t n) {
  GRID_STRIDE(j, n / N) {
    float x[N], y[N];
    load_f32<N>(a + j * N, x);
    load_f32<N>(b + j * N, y);
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] += y[k];
    store_f32<N>(a + j * N, x);
  }
}

template <int N, class T>
__global__ void scale_kernel(T* __restrict__ x, float v, int64_t n) {
  GRID_STRIDE(j, n / N) {
    float vals[N];
    load_f32<N>(x + j * N, vals);
#pragma unroll
    for (int k = 0; k < N; ++k) vals[k] *= v;
    store_f32<N>(x + j * N, vals);
  }
}

template <int N, class T>
__global__ void sum_squares_kernel(const T* __restrict__ x, int64_t n, double* out) {
  float acc = 0.f;
  GRID_STRIDE(j, n / N) {
    float v[N];
    load_f32<N>(x + j * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k) acc += v[k] * v[k];
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(out, double(acc));
}

template <int N, class T>
__global__ void clip_scale_kernel(T* __restrict__ x, int64_t n, const double* __restrict__ total_sq,
                                  double max_norm) {
  const double coef = max_norm / (sqrt(*total_sq) + 1e-6);
  if (coef >= 1.0) return;
  GRID_STRIDE(j, n / N) {
    float v[N];
    load_f32<N>(x + j * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] *= float(coef);
    store_f32<N>(x + j * N, v);
  }
}

// y[r, c] += bias[c]: GEMM's bias where the BIAS epilogue cannot take the vector. N columns a
// thread-step would need cols a multiple of N (a pack never crosses a row).
template <int N, class T>
__global__ void add_bias_rows_kernel(T* __restrict__ y, const T* __restrict__ bias, int64_t rows,
                                     int64_t cols) {
  GRID_STRIDE(j, rows * cols / N) {
    float v[N], b[N];
    load_f32<N>(y + j * N, v);
    load_f32<N>(bias + j * N % cols, b);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += b[k];
    store_f32<N>(y + j * N, v);
  }
}

// db[c] += sum over rows of dy[r, c], in two deterministic passes (no atomics: the same sums in
// the same order on every run, at any occupancy). Pass 1: block (x, y) takes a tile of
// kSumRowsCols columns and the y-th chunk of `chunk` rows; its kSumRowsLanes row lanes each sum
// every kSumRowsLanes-th row of the chunk (a warp reads kSumRowsCols consecutive columns of one
// row: coalesced), and lane 0 adds the lanes' sums in lane order. With one chunk it adds into db
// directly; otherwise it writes the chunk's f32 partial sums to partial[y, c], and pass 2 adds
// them in chunk order.
constexpr int kSumRowsCols = 32, kSumRowsLanes = 8;

template <class T, class G>
__global__ void sum_rows_partial_kernel(const T* __restrict__ dy, int64_t rows, int64_t cols,
                                        int64_t chunk, float* __restrict__ partial,
                                        G* __restrict__ db) {
  __shared__ float lanes[kSumRowsLanes][kSumRowsCols];
  const int64_t c = int64_t(blockIdx.x) * kSumRowsCols + threadIdx.x;
  const int64_t begin = int64_t(blockIdx.y) * chunk;
  const int64_t end = begin + chunk < rows ? begin + chunk : rows;
  float acc = 0.f;
  if (c < cols)
    for (int64_t r = begin + threadIdx.y; r < end; r += kSumRowsLanes)
      acc += to_f32(dy[r * cols + c]);
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float sum = lanes[0][threadIdx.x];
  for (int l = 1; l < kSumRowsLanes; ++l) sum += lanes[l][threadIdx.x];
  if (partial)
    partial[int64_t(blockIdx.y) * cols + c] = sum;
  else
    db[c] = from_f32<G>(to_f32(db[c]) + sum);
}

template <class G>
__global__ void sum_rows_finish_kernel(const float* __restrict__ partial, int64_t chunks,
                                       int64_t cols, G* __restrict__ db) {
  GRID_STRIDE(c, cols) {
    float sum = 0.f;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[k * cols + c];
    db[c] = from_f32<G>(to_f32(db[c]) + sum);
  }
}

void add(const void* a, const void* b, void* out, DType t, int64_t n, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "add", [&](auto tv) {
    using T = decltype(tv);
    constexpr int N = vec_elems<T>();
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    launch_vec<N>(n, vec_aligned<N>(pa) && vec_aligned<N>(pb) && vec_aligned<N>(po),
                  [&](auto w, int64_t off, int64_t cnt) {
                    constexpr int W = decltype(w)::value;
                    add_kernel<W, T><<<grid_for(cnt / W, 256), 256, 0, cudaStream_t(s)>>>(
                        pa + off, pb + off, po + off, cnt);
                  });
  });
  CUDA_CHECK(cudaGetLastError());
}

void add_inplace(void* a, DType at, const void* b, DType bt, int64_t n, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(at, "add_", [&](auto av) {
    using A = decltype(av);
    dispatch_float(bt, "add_", [&](auto bv) {
      using B = decltype(bv);
      constexpr int N = vec_elems<A, B>();
      A* pa = static_cast<A*>(a);
      const B* pb = static_cast<const B*>(b);
      launch_vec<N>(
          n, vec_aligned<N>(pa) && vec_aligned<N>(pb), [&](auto w, int64_t off, int64_t cnt) {
            constexpr int W = decltype(w)::value;
            add_inplace_kernel<W, A, B>
                <<<grid_for(cnt / W, 256), 256, 0, cudaStream_t(s)>>>(pa + off, pb + off, cnt);
          });
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

void scale(void* x, DType t, double v, int64_t n, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "scale_", [&](auto tv) {
    using T = decltype(tv);
    constexpr int N = vec_elems<T>();
    T* px = static_cast<T*>(x);
    launch_vec<N>(n, vec_aligned<N>(px), [&](auto w, int64_t off, int64_t cnt) {
      constexpr int W = decltype(w)::value;
      scale_kernel<W, T>
          <<<grid_for(cnt / W, 256), 256, 0, cudaStream_t(s)>>>(px + off, float(v), cnt);
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

void sum_squares_into(const void* x, DType t, int64_t n, double* acc, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "sum_squares", [&](auto tv) {
    using T = decltype(tv);
    constexpr int N = vec_elems<T>();
    const T* px = static_cast<const T*>(x);
    launch_vec<N>(n, vec_aligned<N>(px), [&](auto w, int64_t off, int64_t cnt) {
      constexpr int W = decltype(w)::value;
      sum_squares_kernel<W, T>
          <<<grid_for(cnt / W, 256, 1024), 256, 0, cudaStream_t(s)>>>(px + off, cnt, acc);
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

void clip_scale(void* x, DType t, int64_t n, const double* total_sq, double max_norm, int device,
                Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "clip_grad_norm", [&](auto tv) {
    using T = decltype(tv);
    constexpr int N = vec_elems<T>();
    T* px = static_cast<T*>(x);
    launch_vec<N>(n, vec_aligned<N>(px), [&](auto w, int64_t off, int64_t cnt) {
      constexpr int W = decltype(w)::value;
      clip_scale_kernel<W, T>
          <<<grid_for(cnt / W, 256), 256, 0, cudaStream_t(s)>>>(px + off, cnt, total_sq, max_norm);
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

void add_bias_rows(void* y, DType t, const void* bias, int64_t rows, int64_t cols, int device,
                   Stream s) {
  if (rows == 0 || cols == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "linear bias", [&](auto tv) {
    using T = decltype(tv);
    // One element a step: gemm.cu adds a bias here only when it is under-aligned for the
    // epilogue (under 16 bytes), so never for a pack.
    add_bias_rows_kernel<1, T><<<grid_for(rows * cols, 256), 256, 0, cudaStream_t(s)>>>(
        static_cast<T*>(y), static_cast<const T*>(bias), rows, cols);
  });
  CUDA_CHECK(cudaGetLastError());
}

SumRowsPlan sum_rows_plan(int64_t rows, int64_t cols) {
  SumRowsPlan p;
  p.col_tiles = (cols + kSumRowsCols - 1) / kSumRowsCols;
  // About 1024 blocks in all (several per SM on any GPU), each with at least 64 rows (8 per row
  // lane); the split depends on the shape only, so the sums are the same on every device.
  constexpr int64_t kBlocks = 1024, kMinRows = 8 * kSumRowsLanes;
  const int64_t by_rows = std::max<int64_t>(1, (rows + kMinRows - 1) / kMinRows);
  const int64_t want = std::max<int64_t>(1, kBlocks / std::max<int64_t>(p.col_tiles, 1));
  p.chunks = std::min<int64_t>({want, by_rows, 65535});
  p.chunk = std::max<int64_t>(1, (rows + p.chunks - 1) / p.chunks);
  p.chunks = std::max<int64_t>(1, (rows + p.chunk - 1) / p.chunk);  // no empty trailing chunk
  return p;
}

void sum_rows_into(const void* dy, DType t, void* db, DType dbt, int64_t rows, int64_t cols,
                   int device, Stream s) {
  if (cols == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  const SumRowsPlan p = sum_rows_plan(rows, cols);
  FSDP_CHECK(p.col_tiles <= int64_t(INT32_MAX), "[sum_rows] {} columns is too many", cols);
  std::optional<Scratch> partial;  // chunks x cols f32, from the caching allocator
  if (p.chunks > 1) partial.emplace(size_t(p.chunks * cols) * sizeof(float), device);
  float* part = partial ? partial->as<float>() : nullptr;
  dispatch_float(t, "sum_rows", [&](auto tv) {
    using T = decltype(tv);
    dispatch_float(dbt, "sum_rows", [&](auto gv) {
      using G = decltype(gv);
      const dim3 grid(unsigned(p.col_tiles), unsigned(p.chunks)),
          block(kSumRowsCols, kSumRowsLanes);
      sum_rows_partial_kernel<T, G><<<grid, block, 0, cudaStream_t(s)>>>(
          static_cast<const T*>(dy), rows, cols, p.chunk, part, static_cast<G*>(db));
      CUDA_CHECK(cudaGetLastError());
      if (part)
        sum_rows_finish_kernel<G><<<grid_for(cols, 256), 256, 0, cudaStream_t(s)>>>(
            part, p.chunks, cols, static_cast<G*>(db));
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
