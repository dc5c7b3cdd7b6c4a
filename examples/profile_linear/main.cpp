// profile_linear: the reference article's torch.profiler example in C++. A
// 4096 x 4096 Linear, forward and backward 5 times on a [1024, 4096] input;
// prints the key-averages table sorted by time and writes trace.json for
// Perfetto. fp16 on CUDA; f32 and bf16 on CPU.
//   build/examples/profile_linear [--device cuda] [--out trace.json]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/nn/init.h"
#include "fsdp/ops/blas.h"
#include "fsdp/ops/ops.h"
#include "fsdp/profiler/profiler.h"

int main(int argc, char** argv) {
  fsdp::ops::use_best_blas_kernel(argv);  // before anything else: it may re-execute
  using namespace fsdp;
  std::string device_s = "cpu", out = "trace.json";
  int64_t n = 4096, rows = 1024;
  CLI::App app{"profile_linear: profile a Linear's forward and backward", "profile_linear"};
  app.add_option("--device", device_s, "cpu or cuda")->capture_default_str();
  app.add_option("--out", out,
                 "Chrome trace to write (one per dtype on CPU: out with the dtype added)")
      ->capture_default_str();
  app.add_option("--features", n, "in and out features")->capture_default_str();
  app.add_option("--rows", rows, "rows of the input")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const Device dev = parse_device(device_s);
    FSDP_CHECK(dev.is_cpu() || cuda_available(), "[profile_linear] --device {}: no CUDA device",
               device_s);
    const std::vector<DType> dtypes = dev.is_cuda() ? std::vector<DType>{DType::f16}
                                                    : std::vector<DType>{DType::f32, DType::bf16};
    for (DType dt : dtypes) {
      auto make = [&](Shape s, const char* name) {
        Tensor t = Tensor::empty(s, DType::f32);
        nn::init_fill(nn::Init::uniform(-0.02, 0.02), 1, name, 0, t);
        return t.to(dt).to(dev);
      };
      Tensor w = make({n, n}, "weight"), b = make({n}, "bias"), x = make({rows, n}, "x");
      Tensor dw = Tensor::zeros({n, n}, dt, dev), db = Tensor::zeros({n}, dt, dev);
      profiler::ProfilerOptions po{.record_shapes = true, .profile_memory = true};
      if (dev.is_cuda()) po.activities.push_back(profiler::Activity::CUDA);
      profiler::Profiler prof(po);
      prof.start();
      for (int i = 0; i < 5; ++i) {
        profiler::RecordFunction step("linear fwd+bwd");
        Tensor y = ops::linear_forward(x, w, b);
        Tensor dy = Tensor::full(y.shape(), 1.0, dt, dev);  // out.sum().backward()
        ops::linear_backward(dy, x, w, dw, db);
      }
      prof.stop();
      const std::string path = dtypes.size() > 1 ? out.substr(0, out.rfind('.')) + "_" +
                                                       std::string(dtype_name(dt)) + ".json"
                                                 : out;
      fmt::print("== Linear {} x {} on [{}, {}], {} on {}\n", n, n, rows, n, dtype_name(dt),
                 dev.str());
      fmt::print("{}", prof.key_averages(true).table(
                           dev.is_cuda() ? "device_time_total" : "cpu_time_total", 10));
      prof.export_chrome_trace(path);
      fmt::print("trace: {} (open in ui.perfetto.dev)\n\n", path);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "profile_linear: error: {}\n", e.what());
    return 1;
  }
}
