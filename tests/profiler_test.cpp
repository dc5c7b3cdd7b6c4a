// The profiler: the Chrome trace is valid JSON that parses back, each
// thread's events nest, every call is one event, the table's totals add up,
// the roofline verdicts follow the ops' FLOP and byte counts,
// and profiling changes no numeric result.
#include "fsdp/profiler/profiler.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>

#include "fsdp/core/allocator.h"
#include "fsdp/distributed/init.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/ops/blas.h"
#include "fsdp/ops/ops.h"
#include "fsdp/profiler/ceilings.h"
#include "fsdp/profiler/metrics.h"
#include "fsdp/profiler/tensorboard.h"
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

// The verdicts of real profiled ops. How fast a GEMM or an RMSNorm runs here depends on the
// machine and its load (a 2048^2 GEMM reached 48% of the cached sgemm peak while another process
// held the cores), so no verdict of a measured rate is asserted: the rows must carry the ops'
// exact FLOP and byte counts and the verdict their rates give against the ceilings in force,
// and the roofline verdict of those counts is checked against fixed ceilings.
TEST(Profiler, RooflineVerdicts) {
  constexpr int64_t n = 1024, rows = 4096;
  Tensor a = test::random_tensor({n, n}, 3, DType::f32);
  Tensor big = test::random_tensor({rows, n}, 4, DType::f32),
         g = Tensor::full({n}, 1.0, DType::f32);
  Profiler prof;
  prof.start();
  for (int i = 0; i < 3; ++i) ops::matmul(a, a);
  for (int i = 0; i < 3; ++i) ops::rmsnorm_forward(big, g, 1e-6);
  prof.stop();
  const KeyAverages avg = prof.key_averages();
  const Ceilings in_force = cpu_ceilings();  // raised by key_averages() to any faster rate
  ASSERT_GT(in_force.flops, 0);
  ASSERT_GT(in_force.bytes_per_s, 0);
  // C = A A: 2 n^3 FLOPs; A read twice, C written and counted as read (beta): 4 n^2 floats.
  // RMSNorm: 4 FLOPs an element; x and g read, y written.
  const double gemm_flops = 2.0 * n * n * n, gemm_bytes = 4.0 * n * n * 4;
  const double norm_flops = 4.0 * rows * n, norm_bytes = (2.0 * rows * n + n) * 4;
  std::map<std::string, KeyAverage> by_name;
  for (const auto& r : avg.rows) by_name[r.name] = r;
  for (const auto& [name, flops, bytes] : {std::tuple{"gemm", gemm_flops, gemm_bytes},
                                           std::tuple{"rmsnorm", norm_flops, norm_bytes}}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(by_name.count(name));
    const KeyAverage& r = by_name[name];
    EXPECT_EQ(r.calls, 3);
    EXPECT_DOUBLE_EQ(r.flops, 3 * flops);
    EXPECT_DOUBLE_EQ(r.bytes, 3 * bytes);
    // The rates are the counts over the wall time, the percentages those rates against the
    // ceilings, and the verdict is classify() of the percentages.
    ASSERT_GT(r.cpu_total_us, 0);
    EXPECT_NEAR(r.flops_per_s, r.flops / (r.cpu_total_us * 1e-6), 1e-9 * r.flops_per_s);
    EXPECT_NEAR(r.bytes_per_s, r.bytes / (r.cpu_total_us * 1e-6), 1e-9 * r.bytes_per_s);
    EXPECT_LE(r.flops_per_s, in_force.flops * (1 + 1e-12));
    EXPECT_NEAR(r.pct_compute, 100.0 * r.flops_per_s / in_force.flops, 1e-9);
    EXPECT_NEAR(r.pct_bandwidth, 100.0 * r.bytes_per_s / in_force.bytes_per_s, 1e-9);
    std::string remedy;
    EXPECT_FALSE(r.verdict.empty());
    EXPECT_EQ(r.verdict, classify(r.pct_compute, r.pct_bandwidth, &remedy));
    EXPECT_EQ(r.remedy, remedy);
  }
  // The roofline of these counts on fixed ceilings: an op at its roof takes max(F / peak,
  // B / bandwidth). On 1 TFLOP/s and 100 GB/s (10 FLOP/byte at the ridge) the GEMM, at
  // n / 8 = 128 FLOP/byte, is at the compute roof; RMSNorm, at under 0.5 FLOP/byte, at the
  // memory roof with under 5% of the peak's FLOPs.
  const Ceilings fixed{.flops = 1e12, .bytes_per_s = 100e9};
  auto at_roof = [&](double flops, double bytes, double* pct_compute, double* pct_bandwidth) {
    const double secs = std::max(flops / fixed.flops, bytes / fixed.bytes_per_s);
    *pct_compute = 100.0 * flops / secs / fixed.flops;
    *pct_bandwidth = 100.0 * bytes / secs / fixed.bytes_per_s;
    std::string remedy;
    return classify(*pct_compute, *pct_bandwidth, &remedy);
  };
  double pc = 0, pb = 0;
  EXPECT_EQ(at_roof(by_name["gemm"].flops, by_name["gemm"].bytes, &pc, &pb), "compute-bound");
  EXPECT_DOUBLE_EQ(pc, 100);
  EXPECT_NEAR(pb, 100.0 * 10 / 128, 1e-9);
  EXPECT_EQ(at_roof(by_name["rmsnorm"].flops, by_name["rmsnorm"].bytes, &pc, &pb), "memory-bound");
  EXPECT_LT(pc, 5);
  EXPECT_DOUBLE_EQ(pb, 100);
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

// The GEMM peak's cache (profiler/ceilings.h) in a folder of its own, with one OpenMP thread
// (a key no other test of this binary uses, so the process's own ceilings start from the file).
class PeakCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/peak_cache_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    saved_dir_ = std::getenv("FSDP_CACHE_DIR") ? std::getenv("FSDP_CACHE_DIR") : "";
    ::setenv("FSDP_CACHE_DIR", dir_.c_str(), 1);
    saved_threads_ = omp_get_max_threads();
    omp_set_num_threads(1);
  }
  void TearDown() override {
    omp_set_num_threads(saved_threads_);
    if (saved_dir_.empty())
      ::unsetenv("FSDP_CACHE_DIR");
    else
      ::setenv("FSDP_CACHE_DIR", saved_dir_.c_str(), 1);
    std::filesystem::remove_all(dir_);
  }
  // The cache's key for this CPU at one thread and OpenBLAS's kernels, as ceilings.cpp spells it.
  static std::string key() {
    std::ifstream f("/proc/cpuinfo");
    std::string line, model = "unknown";
    while (std::getline(f, line))
      if (line.rfind("model name", 0) == 0) {
        model = line.substr(line.find(':') + 2);
        break;
      }
    return model + " x1 " + ops::blas_kernel();
  }
  void write(const std::string& text) const { std::ofstream(sgemm_peak_cache_path()) << text; }
  nlohmann::json read() const {
    return nlohmann::json::parse(std::ifstream(sgemm_peak_cache_path()));
  }
  std::string dir_, saved_dir_;
  int saved_threads_ = 1;
};

TEST_F(PeakCache, ALowCachedPeakIsRaisedByAnObservedRateAndNoRowReadsAbove100) {
  ASSERT_EQ(sgemm_peak_cache_path(), dir_ + "/sgemm_peak.json");
  // 1 MFLOP/s: any GEMM runs faster, on any machine and load (a peak cached while busy).
  write(nlohmann::json{{key(), 1e6}, {"another cpu x64", 5e9}}.dump());
  Tensor a = test::random_tensor({128, 128}, 6, DType::f32);
  Tensor big = test::random_tensor({512, 128}, 7, DType::f32),
         g = Tensor::full({128}, 1.0, DType::f32);
  Profiler prof;
  prof.start();
  for (int i = 0; i < 3; ++i) ops::matmul(a, a);
  ops::rmsnorm_forward(big, g, 1e-6);
  prof.stop();
  const KeyAverages avg = prof.key_averages();
  double fastest = 0;
  for (const auto& r : avg.rows) {
    EXPECT_LE(r.pct_compute, 100.0) << r.name;
    if (!r.verdict.empty()) fastest = std::max(fastest, r.flops_per_s);
  }
  ASSERT_GT(fastest, 1e6);
  ASSERT_EQ(avg.peak_notes.size(), 1u);
  EXPECT_NE(avg.peak_notes[0].find("above the GEMM peak of 0.0 GFLOP/s"), std::string::npos)
      << avg.peak_notes[0];
  const std::string table = avg.table();
  EXPECT_NE(table.find("peak | cpu f32: "), std::string::npos) << table;
  EXPECT_NE(table.find(sgemm_peak_cache_path()), std::string::npos) << table;
  // The cache is rewritten with the observed rate; the other entries stay.
  const nlohmann::json cache = read();
  EXPECT_DOUBLE_EQ(cache[key()].get<double>(), fastest);
  EXPECT_EQ(cache["another cpu x64"].get<double>(), 5e9);
  // The process's ceilings hold the raised peak; a lower rate never lowers it.
  EXPECT_DOUBLE_EQ(cpu_ceilings().flops, fastest);
  EXPECT_DOUBLE_EQ(raise_sgemm_peak(1, fastest / 2), fastest);
  EXPECT_DOUBLE_EQ(read()[key()].get<double>(), fastest);
  EXPECT_DOUBLE_EQ(raise_sgemm_peak(1, fastest * 2), fastest * 2);
  EXPECT_DOUBLE_EQ(read()[key()].get<double>(), fastest * 2);
}

TEST_F(PeakCache, GarbageIsNamedAndNotUsed) {
  // A bad entry: named on stderr, dropped, not taken as a peak (an observed rate is no peak
  // either: the entry is left to a measurement).
  write(nlohmann::json{{key(), "fast"}, {"another cpu x64", -3}}.dump());
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(raise_sgemm_peak(1, 7e9), 7e9);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("holds \"fast\" for '" + key() + "', not a positive number"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("holds -3 for 'another cpu x64'"), std::string::npos) << err;
  // A file that is not JSON: named and ignored (sgemm_peak_flops then measures again; a raise
  // reads the file the same way, without the measurement's seconds).
  write("\x7f garbage {");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(raise_sgemm_peak(1, 7e9), 7e9);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(
      err.find("the peak cache '" + sgemm_peak_cache_path() + "' is not a JSON object of FLOP/s"),
      std::string::npos)
      << err;
  EXPECT_NE(err.find("measuring again"), std::string::npos) << err;
}

// TensorBoard's framing: CRC-32C's check value (RFC 3720's "123456789"), TFRecord's mask of it,
// and the step line's durations. (tensorboard_test reads whole event files with TensorBoard.)
TEST(TensorBoard, Crc32cCheckValueAndTheMask) {
  EXPECT_EQ(profiler::crc32c("123456789", 9), 0xe3069283u);
  const uint32_t c = profiler::crc32c("", 0);
  EXPECT_EQ(profiler::masked_crc32c("", 0), ((c >> 15) | (c << 17)) + 0xa282ead8u);
  EXPECT_EQ(profiler::short_duration(42.4), "42s");
  EXPECT_EQ(profiler::short_duration(192), "3m12s");
  EXPECT_EQ(profiler::short_duration(7500), "2h05m");
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
  nn::TransformerConfig c;
  c.arch = nn::Arch::decoder, c.vocab = 50, c.dim = 32, c.layers = 2, c.heads = 2, c.seq = 16,
  c.batch = 2;
  auto run = [&](bool profile) {
    nn::Transformer m(c);
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
