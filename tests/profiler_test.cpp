// The profiler: the Chrome trace is valid JSON that parses back, each
// thread's events nest, every call is one event, the table's totals add up,
// a large GEMM is compute-bound and RMSNorm on a large tensor memory-bound,
// and profiling changes no numeric result.
#include "fsdp/profiler/profiler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>

#include "fsdp/core/allocator.h"
#include "fsdp/dist/init.h"
#include "fsdp/nn/minillm.h"
#include "fsdp/ops/ops.h"
#include "fsdp/profiler/metrics.h"
#include "test_util.h"

namespace fsdp::profiler {
namespace {

TEST(Profiler, TraceParsesNestsAndCountsCalls) {
  Tensor x = test::random_tensor({64, 128}, 1, DType::f32),
         w = test::random_tensor({96, 128}, 2, DType::f32);
  Profiler prof({.record_shapes = true, .profile_memory = true});
  prof.start();
  for (int i = 0; i < 7; ++i) {
    RecordFunction outer("block");
    Tensor y = ops::linear_forward(x, w, Tensor());
    ops::rmsnorm_forward(y, Tensor::full({96}, 1.0, DType::f32), 1e-6);
  }
  prof.stop();
  const std::string path = ::testing::TempDir() + "/trace.json";
  prof.export_chrome_trace(path);
  nlohmann::json j;
  std::ifstream(path) >> j;  // throws if it is not JSON
  ASSERT_TRUE(j.contains("traceEvents"));
  int linear = 0, annotations = 0, counters = 0, names = 0;
  std::map<int, std::vector<std::pair<double, double>>> by_thread;
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") ++names;
    if (e["ph"] == "C") ++counters;
    if (e["ph"] != "X") continue;
    if (e["name"] == "linear") {
      ++linear;
      EXPECT_EQ(e["cat"], "cpu_op");
      EXPECT_EQ(e["args"]["Input Dims"], "[64, 128], [96, 128]");
      EXPECT_DOUBLE_EQ(e["args"]["flops"].get<double>(), 2.0 * 64 * 128 * 96);
    }
    if (e["cat"] == "user_annotation") ++annotations;
    by_thread[e["tid"].get<int>()].push_back(
        {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
  }
  EXPECT_EQ(linear, 7);
  EXPECT_EQ(annotations, 7);
  EXPECT_GT(counters, 0);
  EXPECT_GE(names, 1);
  for (auto& [tid, ev] : by_thread) {  // intervals on one thread nest: no partial overlap
    std::sort(ev.begin(), ev.end(), [](auto a, auto b) {
      return a.first < b.first || (a.first == b.first && a.second > b.second);
    });
    std::vector<double> open;
    for (auto [b, e] : ev) {
      while (!open.empty() && open.back() <= b + 1e-3) open.pop_back();
      if (!open.empty()) EXPECT_LE(e, open.back() + 1e-3) << "thread " << tid;
      open.push_back(e);
    }
  }
  auto avg = prof.key_averages();
  double self = 0;
  for (auto& r : avg.rows) {
    self += r.self_cpu_us;
    if (r.name == "linear") EXPECT_EQ(r.calls, 7);
    if (r.name == "block") EXPECT_LT(r.self_cpu_us, r.cpu_total_us);  // its ops are its children
  }
  EXPECT_NEAR(self, avg.self_cpu_total_us, 1e-6 * avg.self_cpu_total_us);
  EXPECT_NE(avg.table().find("Self CPU time total"), std::string::npos);
}

TEST(Profiler, RooflineVerdicts) {
  Tensor a = test::random_tensor({2048, 2048}, 3, DType::f32);
  Tensor big = test::random_tensor({8192, 2048}, 4, DType::f32),
         g = Tensor::full({2048}, 1.0, DType::f32);
  ops::matmul(a, a);  // warm up BLAS
  ops::rmsnorm_forward(big, g, 1e-6);
  Profiler prof;
  prof.start();
  for (int i = 0; i < 3; ++i) ops::matmul(a, a);
  for (int i = 0; i < 3; ++i) ops::rmsnorm_forward(big, g, 1e-6);
  prof.stop();
  for (auto& r : prof.key_averages().rows) {
    if (r.name == "gemm") EXPECT_EQ(r.verdict, "compute-bound") << r.pct_compute << "% of peak";
    if (r.name == "rmsnorm") {
      // Whether it reaches 75% of the memcpy ceiling (the "memory-bound" line) depends on the
      // machine and its load (60-73% on a loaded 2-core box); that it is far from the compute
      // ceiling and leans on memory does not.
      EXPECT_NE(r.verdict, "compute-bound");
      EXPECT_LT(r.pct_compute, 25);
      EXPECT_GT(r.pct_bandwidth, 5 * r.pct_compute)
          << r.pct_compute << "% compute, " << r.pct_bandwidth << "% bandwidth";
    }
  }
}

TEST(Profiler, StepMetricsOverAWorldOfOne) {
  auto world = dist::init_process_group();
  StepMetrics m = gather_step_metrics(*world, Device::cpu(),
                                      {.step = 3,
                                       .loss = 2.5,
                                       .grad_norm = 1.25,
                                       .lr = 3e-4,
                                       .step_seconds = 0.5,
                                       .tokens = 1000,
                                       .flops_per_token = 1e6,
                                       .peak_flops = 4e9});
  EXPECT_EQ(m.loss, 2.5);
  EXPECT_EQ(m.tokens_per_s, 2000);
  EXPECT_DOUBLE_EQ(m.mfu, 0.5);
  EXPECT_EQ(m.peak_mem_bytes, double(memory_stats(Device::cpu()).peak));
  EXPECT_EQ(m.line().substr(0, 48), "step 3 | loss 2.5000 | 2000 tok/s | mfu 50.0% | ");
  m.val_loss = 2.0;
  auto j = nlohmann::json::parse(m.json());
  EXPECT_EQ(j["step"], 3);
  EXPECT_EQ(j["val_loss"], 2.0);
  EXPECT_EQ(j["tok_s"], 2000.0);
  dist::destroy_process_group();
}

TEST(Profiler, ClassifyFollowsTheThresholds) {
  std::string remedy;
  EXPECT_EQ(classify(80, 10, &remedy), "compute-bound");
  EXPECT_EQ(classify(80, 90, &remedy), "compute-bound");
  EXPECT_EQ(classify(5, 80, &remedy), "memory-bound");
  EXPECT_NE(remedy.find("fuse"), std::string::npos);
  EXPECT_EQ(classify(5, 60, &remedy), "latency/launch-bound");
  EXPECT_EQ(classify(40, 80, &remedy), "latency/launch-bound");
}

TEST(Profiler, ProfilingChangesNoResult) {
  nn::MiniLLMConfig c;
  c.arch = nn::Arch::llama, c.vocab = 50, c.dim = 32, c.layers = 2, c.heads = 2, c.seq = 16,
  c.batch = 2;
  auto run = [&](bool profile) {
    nn::MiniLLM m(c);
    auto flat = nn::materialize(m, DType::f32, 9);
    Tensor tok = test::random_ids({2, 16}, 50, 1), tgt = test::random_ids({32}, 50, 2);
    Profiler prof({.record_shapes = true, .profile_memory = true});
    if (profile) prof.start();
    Tensor logits = m.forward(tok).view({32, 50});
    auto x = ops::cross_entropy_forward(logits, tgt);
    m.backward(ops::cross_entropy_backward(logits, tgt, x.lse).view({2, 16, 50}));
    if (profile) prof.stop();
    EXPECT_EQ(!prof.records().empty(), profile);
    auto v = flat.grads.to_f64_vector();
    v.push_back(x.loss);
    return v;
  };
  EXPECT_EQ(run(true), run(false));
}

TEST(Profiler, ScheduleKeepsOnlyTheActiveSteps) {
  Tensor x = test::random_tensor({8, 8}, 5, DType::f32);
  Profiler prof({.schedule = Schedule{.wait = 1, .warmup = 1, .active = 2}});
  prof.start();
  for (int s = 0; s < 5; ++s) {
    ops::add(x, x);
    prof.step();
  }
  prof.stop();
  int adds = 0;
  for (auto& r : prof.records()) adds += r.name == "add";
  EXPECT_EQ(adds, 2);  // steps 2 and 3
}

}  // namespace
}  // namespace fsdp::profiler
