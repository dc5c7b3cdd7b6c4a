// Elementwise kernels and reductions on the device, accumulating in f32.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

template <class T>
__global__ void add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                           int64_t n) {
  GRID_STRIDE(i, n) out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <class A, class B>
__global__ void add_inplace_kernel(A* __restrict__ a, const B* __restrict__ b, int64_t n) {
  GRID_STRIDE(i, n) a[i] = from_f32<A>(to_f32(a[i]) + to_f32(b[i]));
}

template <class T>
__global__ void scale_kernel(T* __restrict__ x, float v, int64_t n) {
  GRID_STRIDE(i, n) x[i] = from_f32<T>(to_f32(x[i]) * v);
}

template <class T>
__global__ void sum_squares_kernel(const T* __restrict__ x, int64_t n, double* out) {
  float acc = 0.f;
  GRID_STRIDE(i, n) {
    const float v = to_f32(x[i]);
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(out, double(acc));
}

template <class T>
__global__ void clip_scale_kernel(T* __restrict__ x, int64_t n, const double* __restrict__ total_sq,
                                  double max_norm) {
  const double coef = max_norm / (sqrt(*total_sq) + 1e-6);
  if (coef >= 1.0) return;
  GRID_STRIDE(i, n) x[i] = from_f32<T>(to_f32(x[i]) * float(coef));
}

// One thread per column, looping over rows: coalesced, deterministic.
template <class T, class G>
__global__ void sum_rows_kernel(const T* __restrict__ dy, G* __restrict__ db, int64_t rows,
                                int64_t cols) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.f;
  for (int64_t r = 0; r < rows; ++r) acc += to_f32(dy[r * cols + c]);
  db[c] = from_f32<G>(to_f32(db[c]) + acc);
}

void add(const void* a, const void* b, void* out, DType t, int64_t n, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "add", [&](auto tv) {
    using T = decltype(tv);
    add_kernel<T><<<grid_for(n, 256), 256, 0, cudaStream_t(s)>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n);
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
      add_inplace_kernel<A, B><<<grid_for(n, 256), 256, 0, cudaStream_t(s)>>>(
          static_cast<A*>(a), static_cast<const B*>(b), n);
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

void scale(void* x, DType t, double v, int64_t n, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "scale_", [&](auto tv) {
    using T = decltype(tv);
    scale_kernel<T><<<grid_for(n, 256), 256, 0, cudaStream_t(s)>>>(static_cast<T*>(x), float(v), n);
  });
  CUDA_CHECK(cudaGetLastError());
}

void sum_squares_into(const void* x, DType t, int64_t n, double* acc, int device, Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "sum_squares", [&](auto tv) {
    using T = decltype(tv);
    sum_squares_kernel<T>
        <<<grid_for(n, 256, 1024), 256, 0, cudaStream_t(s)>>>(static_cast<const T*>(x), n, acc);
  });
  CUDA_CHECK(cudaGetLastError());
}

void clip_scale(void* x, DType t, int64_t n, const double* total_sq, double max_norm, int device,
                Stream s) {
  if (n == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "clip_grad_norm", [&](auto tv) {
    using T = decltype(tv);
    clip_scale_kernel<T>
        <<<grid_for(n, 256), 256, 0, cudaStream_t(s)>>>(static_cast<T*>(x), n, total_sq, max_norm);
  });
  CUDA_CHECK(cudaGetLastError());
}

void sum_rows_into(const void* dy, DType t, void* db, DType dbt, int64_t rows, int64_t cols,
                   int device, Stream s) {
  if (cols == 0) return;
  CUDA_CHECK(cudaSetDevice(device));
  dispatch_float(t, "sum_rows", [&](auto tv) {
    using T = decltype(tv);
    dispatch_float(dbt, "sum_rows", [&](auto gv) {
      using G = decltype(gv);
      sum_rows_kernel<T, G><<<grid_for(cols, 256, 1u << 30), 256, 0, cudaStream_t(s)>>>(
          static_cast<const T*>(dy), static_cast<G*>(db), rows, cols);
    });
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fsdp::kernels::cuda
