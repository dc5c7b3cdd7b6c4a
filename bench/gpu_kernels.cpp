// fsdp-bench-kernels: each CUDA op of a training step at the seed preset's
// shapes (B 8, T 1024, dim 2048, 16 heads, vocab 32000, bf16; a 64M-parameter
// f32 shard for AdamW and FSDP's copy), timed with CUDA events on the compute
// stream, next to its floor: its FLOPs at the bf16 GEMM rate or its bytes at
// the copy bandwidth, whichever is longer, both measured in this run on random
// data. The ops are the op-case table's perf_cases() (tests/op_cases.h): each
// case's forward, and its backward where it has one, with the FLOPs and bytes
// of src/ops/cost.h, so that a new op is one entry there. Attention is also
// timed through our own kernel (the fallback where cuDNN's SDPA is built).
// Prints a Markdown table; bench/torch_attention.py times PyTorch's SDPA on
// the same shapes for the side-by-side.
//   fsdp-bench-kernels [--batch 8 --seq 1024 --dim 2048 --heads 16 --vocab 32000
//                       --shard 67108864]
#include <cuda_runtime.h>
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/profiler/ceilings.h"
#include "kernels/cuda/cuda_kernels.h"
#include "src/ops/cost.h"
#include "tests/op_cases.h"

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
  double ms;
  ops::cost::Cost cost;
};

// A case's inputs on the GPU, drawn there (the table's make_inputs draws in f64 on the CPU, slow
// at these sizes): floats uniform in the input's range, ids spread over the vocabulary.
std::vector<Tensor> gpu_inputs(const test::OpCase& c, DType dtype, uint64_t seed) {
  std::vector<Tensor> in;
  for (const test::OpInput& s : c.inputs) {
    if (s.vocab > 0) {
      std::vector<int32_t> ids(static_cast<size_t>(shape_numel(s.shape)));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(int64_t(i) * 7919 % s.vocab);
      in.push_back(Tensor::from_vector<int32_t>(ids, s.shape).to(kGpu));
    } else {
      in.push_back(random(s.shape, dtype, seed++, s.lo, s.hi));
    }
  }
  return in;
}

// The case's name less its op ("attention [8, 1024, 6144] h16 causal": "[8, 1024, 6144] h16
// causal"), and its dtype where that is not bf16.
std::string shape_of(const test::OpCase& c, DType dt) {
  std::string s = c.what;
  if (s.starts_with(c.op + " ")) s.erase(0, c.op.size() + 1);
  if (dt != DType::bf16) s += fmt::format(" ({})", dtype_name(dt));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-bench-kernels: the step's CUDA ops at the seed shapes against their floors"};
  test::ModelShape m;
  app.add_option("--batch", m.batch)->check(CLI::PositiveNumber);
  app.add_option("--seq", m.seq)->check(CLI::PositiveNumber);
  app.add_option("--dim", m.dim)->check(CLI::PositiveNumber);
  app.add_option("--heads", m.heads)->check(CLI::PositiveNumber);
  app.add_option("--vocab", m.vocab)->check(CLI::PositiveNumber);
  app.add_option("--shard", m.shard, "parameters in the flat shard (AdamW, copy_segments)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    FSDP_CHECK(cuda_available(), "[fsdp-bench-kernels] no CUDA device");
    FSDP_CHECK(m.dim % m.heads == 0, "[fsdp-bench-kernels] --dim {} is not divisible by --heads {}",
               m.dim, m.heads);
    const double gemm_peak = profiler::device_gemm_peak_flops(kGpu, DType::bf16);
    const double copy_bps = profiler::device_copy_gbps(kGpu) * 1e9;
    std::vector<Row> rows;
    const std::vector<test::OpCase> cases = test::perf_cases(m);
    uint64_t seed = 1;
    for (const test::OpCase& c : cases)
      for (DType dt : c.dtypes) {
        FSDP_CHECK(c.forward_cost && (c.backward_cost || !c.backward),
                   "[fsdp-bench-kernels] the case '{}' has no cost (tests/op_cases.cpp)", c.what);
        const std::string shape = shape_of(c, dt);
        // Attention runs through the op (cuDNN's SDPA where built) and through our own kernel.
        const bool own_kernel = c.op == "attention";
        const std::string how = own_kernel ? " (op)" : "";
        std::vector<Tensor> in = gpu_inputs(c, dt, seed);
        seed += c.inputs.size();
        // In place: an op that updates its inputs (rope_, add_, adamw_) does so on each call.
        const test::OpRun fwd = c.forward(in, true);
        const ops::cost::Cost fwd_cost = c.forward_cost(in, fwd);
        rows.push_back({c.op + how, shape, time_ms([&] { c.forward(in, true); }), fwd_cost});
        if (!c.backward) continue;
        const Tensor& out0 = fwd.out[0];
        const Tensor dout = random(out0.shape(), out0.dtype(), seed++);
        const double dout_scalar = dout.numel() == 1 ? dout.to(Device::cpu()).item() : 0.0;
        const std::vector<Tensor> acc = test::make_acc(c, in, 0.0);  // dW in f32
        const test::BackwardArgs args{in, fwd, dout, dout_scalar, acc};
        const ops::cost::Cost bwd_cost = c.backward_cost(args);
        rows.push_back(
            {c.op + "_backward" + how, shape, time_ms([&] { c.backward(args); }), bwd_cost});
        if (!own_kernel) continue;
        // perf_cases' attention is multi-head at the model's heads; its name says causal.
        const Tensor& qkv = in[0];
        const int64_t B = qkv.shape()[0], T = qkv.shape()[1], H = m.heads, hd = m.dim / m.heads;
        FSDP_CHECK(qkv.dim() == 3 && qkv.shape()[2] == 3 * H * hd,
                   "[fsdp-bench-kernels] '{}' is not a multi-head qkv of {} heads", c.what, H);
        const bool causal = c.what.ends_with(" causal");
        Tensor out = Tensor::empty({B, T, H * hd}, dt, kGpu),
               lse = Tensor::empty({B, H, T}, DType::f32, kGpu),
               dqkv = Tensor::empty(qkv.shape(), dt, kGpu);
        rows.push_back({c.op + " (own kernel)", shape,
                        time_ms(
                            [&] {
                              kc::attention_forward(qkv.raw_data(), out.raw_data(),
                                                    lse.data<float>(), dt, B, T, H, H, hd, causal,
                                                    nullptr, 0, 0, stream());
                            },
                            2),
                        fwd_cost});
        rows.push_back({c.op + "_backward (own kernel)", shape,
                        time_ms(
                            [&] {
                              kc::attention_backward(dout.raw_data(), qkv.raw_data(),
                                                     out.raw_data(), lse.data<float>(),
                                                     dqkv.raw_data(), dt, B, T, H, H, hd, causal,
                                                     nullptr, 0, 0, stream());
                            },
                            2),
                        bwd_cost});
      }

    fmt::print(
        "Ceilings measured in this run: bf16 GEMM {:.1f} TFLOP/s (random data), D2D copy "
        "{:.0f} GB/s (read + write).\n\n",
        gemm_peak / 1e12, copy_bps / 1e9);
    fmt::print("| op | shape | ms | floor ms | bound by | time / floor |\n");
    fmt::print("| --- | --- | ---: | ---: | --- | ---: |\n");
    for (const Row& r : rows) {
      const double by_flops = r.cost.flops / gemm_peak, by_bytes = r.cost.bytes / copy_bps;
      const double fl = std::max(by_flops, by_bytes) * 1e3;
      fmt::print("| {} | {} | {:.3f} | {:.3f} | {} | {:.2f}x |\n", r.op, r.shape, r.ms, fl,
                 by_flops >= by_bytes ? "FLOPs" : "bytes", r.ms / fl);
    }
    return 0;
  } catch (const std::exception& ex) {
    fmt::print(stderr, "fsdp-bench-kernels: error: {}\n", ex.what());
    return 1;
  }
}
