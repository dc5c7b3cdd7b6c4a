// fsdp-bench-kernels: each CUDA op of a training step at the seed preset's
// shapes (B 8, T 1024, dim 2048, 16 heads, vocab 32000, bf16), timed with CUDA
// events on the compute stream, next to its floor: the FLOPs it must do at
// the bf16 GEMM rate, or the bytes it must move at the copy bandwidth, both
// measured in this run on random data. Attention is timed through the op
// (cuDNN's SDPA where built) and through our own kernel (the fallback).
// Prints a Markdown table; bench/torch_attention.py times PyTorch's SDPA on
// the same shapes for the side-by-side.
//   fsdp-bench-kernels [--batch 8 --seq 1024 --dim 2048 --heads 16 --vocab 32000]
#include <cuda_runtime.h>
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/ops/ops.h"
#include "fsdp/profiler/ceilings.h"
#include "kernels/cuda/cuda_kernels.h"

using namespace fsdp;
namespace kc = kernels::cuda;

namespace {

const Device kGpu = Device::cuda(0);

cudaStream_t stream() { return cudaStream_t(cuda_compute_stream(0)); }

Tensor random(const Shape& s, DType t, uint64_t seed, double lo = -1, double hi = 1) {
  Tensor x = Tensor::empty(s, t, kGpu);
  kc::fill_uniform(x.raw_data(), t, x.numel(), lo, hi, seed, 0, stream());
  return x;
}

// Milliseconds per call: 3 warm-up calls, then the mean of `iters`, by CUDA events.
double time_ms(const std::function<void()>& f, int iters = 10) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0, stream());
  for (int i = 0; i < iters; ++i) f();
  cudaEventRecord(e1, stream());
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  FSDP_CHECK(cudaGetLastError() == cudaSuccess, "[fsdp-bench-kernels] a launch failed");
  return double(ms) / iters;
}

struct Row {
  std::string op, shape;
  double ms, flops, bytes;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-bench-kernels: the step's CUDA ops at the seed shapes against their floors"};
  int64_t B = 8, T = 1024, D = 2048, H = 16, V = 32000;
  app.add_option("--batch", B)->check(CLI::PositiveNumber);
  app.add_option("--seq", T)->check(CLI::PositiveNumber);
  app.add_option("--dim", D)->check(CLI::PositiveNumber);
  app.add_option("--heads", H)->check(CLI::PositiveNumber);
  app.add_option("--vocab", V)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    FSDP_CHECK(cuda_available(), "[fsdp-bench-kernels] no CUDA device");
    FSDP_CHECK(D % H == 0, "[fsdp-bench-kernels] --dim {} is not divisible by --heads {}", D, H);
    const DType bf = DType::bf16;
    const double gemm_peak = profiler::device_gemm_peak_flops(kGpu, bf);
    const double copy_bps = profiler::device_copy_gbps(kGpu) * 1e9;
    const int64_t N = B * T, hd = D / H;
    std::vector<Row> rows;
    auto shape = [](std::initializer_list<int64_t> s) {
      std::string r;
      for (int64_t v : s) r += (r.empty() ? "" : "x") + std::to_string(v);
      return r;
    };

    // Attention: the op (cuDNN where built) and our own kernel, both masks.
    Tensor qkv = random({B, T, 3 * D}, bf, 1), dout = random({B, T, D}, bf, 2);
    for (bool causal : {false, true}) {
      const double f =
          4.0 * double(B * H) * double(T) * double(T) * double(hd) * (causal ? 0.5 : 1.0);
      const std::string s = shape({B, H, T, hd}) + (causal ? " causal" : "");
      ops::AttentionOut a = ops::attention_forward(qkv, H, causal);
      rows.push_back({"attention (op)", s,
                      time_ms([&] { a = ops::attention_forward(qkv, H, causal); }), f, 0});
      rows.push_back({"attention_backward (op)", s,
                      time_ms([&] { ops::attention_backward(dout, qkv, a.out, a.lse, H, causal); }),
                      2.5 * f, 0});
      Tensor out = Tensor::empty({B, T, D}, bf, kGpu),
             lse = Tensor::empty({B, H, T}, DType::f32, kGpu),
             dqkv = Tensor::empty(qkv.shape(), bf, kGpu);
      rows.push_back({"attention (own kernel)", s,
                      time_ms(
                          [&] {
                            kc::attention_forward(qkv.raw_data(), out.raw_data(), lse.data<float>(),
                                                  bf, B, T, H, H, hd, causal, 0, stream());
                          },
                          2),
                      f, 0});
      rows.push_back({"attention_backward (own kernel)", s,
                      time_ms(
                          [&] {
                            kc::attention_backward(dout.raw_data(), qkv.raw_data(), out.raw_data(),
                                                   lse.data<float>(), dqkv.raw_data(), bf, B, T, H,
                                                   H, hd, causal, 0, stream());
                          },
                          2),
                      2.5 * f, 0});
    }

    // Linear at the FFN's shape: forward, and backward into an f32 dW.
    Tensor x = random({N, D}, bf, 3), w = random({4 * D, D}, bf, 4), dy = random({N, 4 * D}, bf, 5);
    Tensor dw = Tensor::zeros({4 * D, D}, DType::f32, kGpu);
    const double lf = 2.0 * double(N) * double(D) * double(4 * D);
    rows.push_back({"linear", shape({N, D}) + " -> " + std::to_string(4 * D),
                    time_ms([&] { ops::linear_forward(x, w, Tensor()); }), lf, 0});
    rows.push_back({"linear_backward (dx, dW f32)", shape({N, D}) + " -> " + std::to_string(4 * D),
                    time_ms([&] { ops::linear_backward(dy, x, w, dw, Tensor()); }), 2 * lf, 0});

    // Memory-bound ops: bytes each must read and write.
    const double e = 2.0;  // bf16
    Tensor g = random({D}, bf, 6, 0.5, 1.5), dwn = Tensor::zeros({D}, DType::f32, kGpu);
    ops::RMSNormOut n = ops::rmsnorm_forward(x, g, 1e-6);
    rows.push_back({"rmsnorm", shape({N, D}), time_ms([&] { ops::rmsnorm_forward(x, g, 1e-6); }), 0,
                    2 * e * double(N * D)});
    Tensor dyn = random({N, D}, bf, 7);
    rows.push_back({"rmsnorm_backward (dx, dw)", shape({N, D}),
                    time_ms([&] { ops::rmsnorm_backward(dyn, x, g, n.rstd, dwn); }), 0,
                    3 * e * double(N * D)});
    Tensor logits = random({N, V}, bf, 8, -3, 3);
    std::vector<int32_t> ids(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) ids[size_t(i)] = int32_t((i * 7919) % V);
    Tensor targets = Tensor::from_vector<int32_t>(ids, {N}).to(kGpu);
    ops::CrossEntropyOut xe = ops::cross_entropy_forward(logits, targets, false);
    rows.push_back({"cross_entropy", shape({N, V}),
                    time_ms([&] { ops::cross_entropy_forward(logits, targets, false); }), 0,
                    e * double(N * V)});
    rows.push_back({"cross_entropy_backward", shape({N, V}),
                    time_ms([&] { ops::cross_entropy_backward(logits, targets, xe.lse, 1.0); }), 0,
                    2 * e * double(N * V)});
    const int64_t P = int64_t(64) << 20;  // a 64M-parameter flat shard, f32 master weights
    Tensor p = random({P}, DType::f32, 9), gr = random({P}, DType::f32, 10),
           m = Tensor::zeros({P}, DType::f32, kGpu), v = Tensor::zeros({P}, DType::f32, kGpu);
    int64_t step = 0;
    rows.push_back({"adamw", shape({P}) + " f32",
                    time_ms([&] { ops::adamw_(p, gr, m, v, {.lr = 1e-4}, ++step); }), 0,
                    28.0 * double(P)});  // reads p, g, m, v; writes p, m, v
    Tensor flat = random({P}, DType::f32, 11), unsharded = Tensor::empty({P}, bf, kGpu);
    std::vector<ops::Segment> segs;
    for (int64_t i = 0; i < 16; ++i) segs.push_back({i * (P / 16), i * (P / 16), P / 16});
    rows.push_back({"copy_segments (f32 -> bf16)", shape({P}),
                    time_ms([&] { ops::copy_segments(unsharded, flat, segs); }), 0,
                    6.0 * double(P)});

    fmt::print(
        "Ceilings measured in this run: bf16 GEMM {:.1f} TFLOP/s (random data), D2D copy "
        "{:.0f} GB/s (read + write).\n\n",
        gemm_peak / 1e12, copy_bps / 1e9);
    fmt::print("| op | shape | ms | floor ms | bound by | time / floor |\n");
    fmt::print("| --- | --- | ---: | ---: | --- | ---: |\n");
    for (const Row& r : rows) {
      const double fl = std::max(r.flops / gemm_peak, r.bytes / copy_bps) * 1e3;
      fmt::print("| {} | {} | {:.3f} | {:.3f} | {} | {:.2f}x |\n", r.op, r.shape, r.ms, fl,
                 r.flops / gemm_peak >= r.bytes / copy_bps ? "FLOPs" : "bytes", r.ms / fl);
    }
    return 0;
  } catch (const std::exception& ex) {
    fmt::print(stderr, "fsdp-bench-kernels: error: {}\n", ex.what());
    return 1;
  }
}
