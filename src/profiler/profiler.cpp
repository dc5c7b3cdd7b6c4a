// Profiler: schedule, Chrome trace export, key averages and roofline verdicts.
#include "fsdp/profiler/profiler.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "fsdp/profiler/ceilings.h"
#include "src/core/gpu.h"

namespace fsdp::profiler {

using json = nlohmann::json;

namespace {

const char* category(const trace::Record& r) {
  switch (r.kind) {
    case trace::Kind::op:
      return "cpu_op";
    case trace::Kind::annotation:
      return "user_annotation";
    case trace::Kind::collective:
      return "cpu_op";
    case trace::Kind::kernel:
      return "kernel";
    case trace::Kind::counter:
      return "memory";
  }
  return "cpu_op";
}

double copy_bytes_per_s() {
  // Parallel memcpy over 256 MiB with the current threads; read + write counted.
  const size_t n = size_t(256) << 20;
  std::vector<char> a(n, 1), b(n, 0);
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {
    const int64_t t0 = trace::now_ns();
#pragma omp parallel
    {
      const int t = omp_get_thread_num(), k = omp_get_num_threads();
      const size_t chunk = (n + size_t(k) - 1) / size_t(k), begin = std::min(n, chunk * size_t(t));
      std::memcpy(b.data() + begin, a.data() + begin, std::min(n, begin + chunk) - begin);
    }
    best = std::min(best, double(trace::now_ns() - t0) * 1e-9);
  }
  return 2.0 * double(n) / best;
}

}  // namespace

namespace {

// The ceilings measured in this process, by thread count (CPU) and by (device, GEMM dtype).
std::map<int, Ceilings>& cpu_cache() {
  static std::map<int, Ceilings> cache;
  return cache;
}
std::map<std::pair<int, DType>, Ceilings>& cuda_cache() {
  static std::map<std::pair<int, DType>, Ceilings> cache;
  return cache;
}
DType gemm_dtype(const std::string& dtype) {
  return dtype == "f32" || dtype == "float32" ? DType::f32 : DType::bf16;
}

}  // namespace

Ceilings cpu_ceilings() {
  const int threads = omp_get_max_threads();
  auto it = cpu_cache().find(threads);
  if (it != cpu_cache().end()) return it->second;
  Ceilings c{sgemm_peak_flops(threads), copy_bytes_per_s()};
  cpu_cache()[threads] = c;
  return c;
}

Ceilings cuda_ceilings(int device, const std::string& dtype) {
  const DType gemm_t = gemm_dtype(dtype);
  auto it = cuda_cache().find({device, gemm_t});
  if (it != cuda_cache().end()) return it->second;
  const Device d = Device::cuda(device);
  Ceilings c{device_gemm_peak_flops(d, gemm_t), device_copy_gbps(d) * 1e9};
  cuda_cache()[{device, gemm_t}] = c;
  return c;
}

std::string classify(double pct_compute, double pct_bandwidth, std::string* remedy) {
  if (pct_compute > 75) {
    *remedy = "lower precision (bf16/fp8), tile sizes that are multiples of 64/128, a bigger GPU";
    return "compute-bound";
  }
  if (pct_compute < 25 && pct_bandwidth > 75) {
    *remedy = "fuse with its neighbours, quantize (FP8/INT4), larger batches";
    return "memory-bound";
  }
  *remedy = "fewer, larger launches (fusion, bigger batches); check the launch and sync overheads";
  return "latency/launch-bound";
}

Profiler::Profiler(ProfilerOptions opt) : opt_(std::move(opt)) {}

Profiler::~Profiler() {
  if (recording_) end_recording(false);
}

bool Profiler::collecting() const { return recording_; }

void Profiler::begin_recording() {
  t0_ns_ = trace::now_ns();
  trace::take();  // drop anything recorded before
  trace::start(opt_.record_shapes, opt_.profile_memory);
  recording_ = true;
  // Device timing with CUDA events (CUPTI is not required): an event before and after each
  // op on a CUDA tensor, on the compute stream, read back at stop().
  const bool cuda = std::find(opt_.activities.begin(), opt_.activities.end(), Activity::CUDA) !=
                    opt_.activities.end();
  if (cuda) device_timing_ = gpu::device_timing_begin();
}

void Profiler::end_recording(bool keep) {
  trace::stop();
  recording_ = false;
  auto recs = trace::take();
  if (device_timing_) {
    std::map<int64_t, const trace::Record*> by_flow;
    for (const auto& r : recs)
      if (r.flow) by_flow[r.flow] = &r;
    std::vector<trace::Record> kernels;
    for (const gpu::DeviceSpan& span : gpu::device_timing_end()) {
      trace::Record k;
      k.kind = trace::Kind::kernel;
      k.flow = span.token;
      k.name = by_flow.count(span.token) ? by_flow[span.token]->name : "kernel";
      k.device = by_flow.count(span.token) ? by_flow[span.token]->device : "cuda";
      k.tid = 1000;  // the compute stream's row
      k.begin_ns = span.begin_ns;
      k.end_ns = span.end_ns;
      kernels.push_back(k);
    }
    recs.insert(recs.end(), kernels.begin(), kernels.end());
    device_timing_ = false;
  }
  if (keep) {
    records_.insert(records_.end(), std::make_move_iterator(recs.begin()),
                    std::make_move_iterator(recs.end()));
    thread_names_ = trace::thread_names();
  }
}

void Profiler::start() {
  ceilings_ = cpu_ceilings();  // measured (or read from the cache) before anything is timed
  ceilings_threads_ = omp_get_max_threads();
  step_ = 0;
  if (!opt_.schedule || opt_.schedule->wait + opt_.schedule->warmup == 0) begin_recording();
}

void Profiler::stop() {
  if (recording_) end_recording(true);
}

void Profiler::step() {
  if (!opt_.schedule) return;
  ++step_;
  const auto& s = *opt_.schedule;
  if (step_ == s.wait && s.warmup + s.active > 0 && !recording_) begin_recording();
  if (step_ == s.wait + s.warmup && recording_ && s.warmup > 0) {  // warm-up records are discarded
    end_recording(false);
    begin_recording();
  }
  if (step_ == s.wait + s.warmup + s.active && recording_) end_recording(true);
}

void Profiler::export_chrome_trace(const std::string& path) const {
  json events = json::array();
  const int pid = opt_.rank;
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", pid},
                    {"args", {{"name", fmt::format("rank {}", pid)}}}});
  for (size_t t = 0; t < thread_names_.size(); ++t)
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", t},
                      {"args", {{"name", thread_names_[t]}}}});
  bool kernels = false;
  auto us = [&](int64_t ns) { return double(ns - t0_ns_) / 1e3; };
  for (const auto& r : records_) {
    if (r.kind == trace::Kind::counter) {
      events.push_back({{"ph", "C"},
                        {"name", "memory allocated"},
                        {"pid", pid},
                        {"ts", us(r.begin_ns)},
                        {"args", {{r.device, r.value}}}});
      continue;
    }
    json args = json::object();
    if (!r.shapes.empty()) args["Input Dims"] = r.shapes;
    if (!r.dtype.empty()) args["dtype"] = r.dtype;
    if (r.flops > 0) args["flops"] = r.flops;
    if (r.bytes > 0) args["bytes"] = r.bytes;
    if (!r.detail.empty()) args["group"] = r.detail;
    if (!r.device.empty()) args["device"] = r.device;
    events.push_back({{"ph", "X"},
                      {"cat", category(r)},
                      {"name", r.name},
                      {"pid", pid},
                      {"tid", r.tid},
                      {"ts", us(r.begin_ns)},
                      {"dur", double(r.end_ns - r.begin_ns) / 1e3},
                      {"args", args}});
    if (r.kind == trace::Kind::kernel) {
      kernels = true;
    } else if (r.flow) {  // launch -> kernel arrow
      events.push_back({{"ph", "s"},
                        {"id", r.flow},
                        {"pid", pid},
                        {"tid", r.tid},
                        {"ts", us(r.begin_ns)},
                        {"cat", "ac2g"},
                        {"name", "launch"}});
    }
  }
  if (kernels) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", 1000},
                      {"args", {{"name", "cuda compute stream"}}}});
    for (const auto& r : records_)
      if (r.kind == trace::Kind::kernel)
        events.push_back({{"ph", "f"},
                          {"bp", "e"},
                          {"id", r.flow},
                          {"pid", pid},
                          {"tid", 1000},
                          {"ts", us(r.begin_ns)},
                          {"cat", "ac2g"},
                          {"name", "launch"}});
  }
  std::ofstream f(path);
  FSDP_CHECK(f.good(), "[profiler] cannot write '{}'", path);
  f << json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
}

KeyAverages Profiler::key_averages(bool group_by_input_shape) const {
  // Self time: each event's duration less its direct children's, per thread.
  std::vector<const trace::Record*> timed;
  for (const auto& r : records_)
    if (r.kind != trace::Kind::counter && r.kind != trace::Kind::kernel) timed.push_back(&r);
  std::sort(timed.begin(), timed.end(), [](auto* a, auto* b) {
    if (a->tid != b->tid) return a->tid < b->tid;
    if (a->begin_ns != b->begin_ns) return a->begin_ns < b->begin_ns;
    return a->end_ns > b->end_ns;
  });
  std::map<const trace::Record*, int64_t> child_ns;
  std::vector<const trace::Record*> stack;
  for (auto* r : timed) {
    while (!stack.empty() && (stack.back()->tid != r->tid || stack.back()->end_ns <= r->begin_ns))
      stack.pop_back();
    if (!stack.empty()) child_ns[stack.back()] += r->end_ns - r->begin_ns;
    stack.push_back(r);
  }
  std::map<int64_t, double> device_ns;
  for (const auto& r : records_)
    if (r.kind == trace::Kind::kernel) device_ns[r.flow] += double(r.end_ns - r.begin_ns);

  std::map<std::pair<std::string, std::string>, KeyAverage> rows;
  KeyAverages out;
  for (auto* r : timed) {
    KeyAverage& k = rows[{r->name, group_by_input_shape ? r->shapes : ""}];
    if (k.calls == 0) k.device = r->device, k.dtype = r->dtype;
    k.name = r->name;
    k.shapes = group_by_input_shape ? r->shapes : "";
    k.category = category(*r);
    ++k.calls;
    const double dur = double(r->end_ns - r->begin_ns) / 1e3;
    const double self = dur - double(child_ns[r]) / 1e3;
    k.cpu_total_us += dur;
    k.self_cpu_us += self;
    out.self_cpu_total_us += self;
    if (r->flow) k.device_us += device_ns[r->flow] / 1e3;
    k.flops += r->flops;
    k.bytes += r->bytes;
  }
  // The rates first, then the ceilings: each judged op is set against its unit's ceiling raised
  // to the fastest rate observed on that unit, so no row reads above 100%.
  std::map<std::pair<std::string, DType>, Ceilings> unit_ceilings;  // by device and GEMM dtype
  std::map<std::pair<std::string, DType>, const KeyAverage*> fastest;
  std::vector<KeyAverage*> judged;
  for (auto& [key, k] : rows) {
    // CUDA ops are timed on the device; CPU ops by wall time on their thread.
    const bool on_cuda = k.device.rfind("cuda:", 0) == 0;
    const double secs = (on_cuda ? k.device_us : k.cpu_total_us) * 1e-6;
    if (secs > 0) {
      k.flops_per_s = k.flops / secs;
      k.bytes_per_s = k.bytes / secs;
    }
    // A CUDA op is set against its GPU's ceilings, from its device time; a CUDA op with no
    // device time (CUDA activity off) gets no verdict, since its launch time says nothing.
    if (k.category == "cpu_op" && (k.flops > 0 || k.bytes > 0) &&
        k.name.find(':') == std::string::npos && (!on_cuda || k.device_us > 0)) {
      judged.push_back(&k);
      const std::pair<std::string, DType> unit{on_cuda ? k.device : "cpu",
                                               on_cuda ? gemm_dtype(k.dtype) : DType::f32};
      if (!unit_ceilings.count(unit))
        unit_ceilings[unit] =
            on_cuda ? cuda_ceilings(std::stoi(k.device.substr(5)), k.dtype) : ceilings_;
      const KeyAverage*& f = fastest[unit];
      if (!f || k.flops_per_s > f->flops_per_s) f = &k;
    }
  }
  // A measured ceiling below an observed rate is wrong (taken on a busy machine, say): it is
  // raised to that rate, here, in this process's later profiles and in the cache.
  for (auto& [unit, f] : fastest) {
    Ceilings& c = unit_ceilings[unit];
    if (f->flops_per_s <= c.flops) continue;
    out.peak_notes.push_back(fmt::format(
        "{} {}: '{}' ran at {:.1f} GFLOP/s, above the GEMM peak of {:.1f} GFLOP/s; the peak is "
        "raised to it (%peakFL is against it) and cached in {}",
        unit.first, dtype_name(unit.second), f->name, f->flops_per_s / 1e9, c.flops / 1e9,
        unit.first == "cpu" ? sgemm_peak_cache_path() : device_gemm_peak_cache_path()));
    c.flops = f->flops_per_s;
    if (unit.first == "cpu") {
      raise_sgemm_peak(ceilings_threads_, c.flops);
      Ceilings& held = cpu_cache()[ceilings_threads_];
      held.flops = std::max(held.flops, c.flops);
    } else {
      const int d = std::stoi(unit.first.substr(5));
      raise_device_gemm_peak(Device::cuda(d), unit.second, c.flops);
      Ceilings& held = cuda_cache()[{d, unit.second}];
      held.flops = std::max(held.flops, c.flops);
    }
  }
  for (KeyAverage* k : judged) {
    const bool on_cuda = k->device.rfind("cuda:", 0) == 0;
    const Ceilings& c =
        unit_ceilings[{on_cuda ? k->device : "cpu", on_cuda ? gemm_dtype(k->dtype) : DType::f32}];
    k->pct_compute = c.flops > 0 ? std::min(100.0, 100.0 * k->flops_per_s / c.flops) : 0;
    k->pct_bandwidth = c.bytes_per_s > 0 ? 100.0 * k->bytes_per_s / c.bytes_per_s : 0;
    k->verdict = classify(k->pct_compute, k->pct_bandwidth, &k->remedy);
  }
  for (auto& [key, k] : rows) out.rows.push_back(k);
  return out;
}

std::string KeyAverages::table(const std::string& sort_by, int row_limit) const {
  std::vector<KeyAverage> r = rows;
  auto key = [&](const KeyAverage& k) {
    if (sort_by == "self_cpu_time_total") return k.self_cpu_us;
    if (sort_by == "device_time_total" || sort_by == "cuda_time_total") return k.device_us;
    if (sort_by == "calls" || sort_by == "count") return double(k.calls);
    if (sort_by == "flops") return k.flops;
    FSDP_CHECK(sort_by == "cpu_time_total",
               "[profiler] cannot sort by '{}'; use cpu_time_total, "
               "self_cpu_time_total, device_time_total, calls or flops",
               sort_by);
    return k.cpu_total_us;
  };
  std::stable_sort(r.begin(), r.end(), [&](auto& a, auto& b) { return key(a) > key(b); });
  const bool shapes = std::any_of(r.begin(), r.end(), [](auto& k) { return !k.shapes.empty(); });
  auto ms = [](double us) {
    return us >= 1000 ? fmt::format("{:.3f}ms", us / 1e3) : fmt::format("{:.3f}us", us);
  };
  std::string line = std::string(shapes ? 214 : 174, '-') + "\n";
  std::string s = line;
  s += fmt::format("{:<38} {:>11} {:>11} {:>11} {:>12} {:>8} {:>10} {:>9} {:>7} {:>7}  {:<21}",
                   "Name", "Self CPU", "CPU total", "CPU avg", "Device total", "# Calls", "GFLOP/s",
                   "GB/s", "%peakFL", "%peakBW", "Verdict");
  if (shapes) s += fmt::format("  {:<38}", "Input Shapes");
  s += "\n" + line;
  int n = 0;
  for (const auto& k : r) {
    if (row_limit > 0 && n++ >= row_limit) break;
    std::string name = k.name.size() > 37 ? k.name.substr(0, 34) + "..." : k.name;
    s += fmt::format(
        "{:<38} {:>11} {:>11} {:>11} {:>12} {:>8} {:>10.1f} {:>9.2f} {:>7.1f} {:>7.1f}  {:<21}",
        name, ms(k.self_cpu_us), ms(k.cpu_total_us), ms(k.cpu_total_us / double(k.calls)),
        k.device_us > 0 ? ms(k.device_us) : std::string("-"), k.calls, k.flops_per_s / 1e9,
        k.bytes_per_s / 1e9, k.pct_compute, k.pct_bandwidth, k.verdict.empty() ? "-" : k.verdict);
    if (shapes) s += fmt::format("  {:<38}", k.shapes.substr(0, 38));
    s += "\n";
  }
  s += line;
  s += fmt::format("Self CPU time total: {}\n", ms(self_cpu_total_us));
  for (const std::string& note : peak_notes) s += "peak | " + note + "\n";
  std::vector<std::string> seen;
  for (const auto& k : r)
    if (!k.verdict.empty() && std::find(seen.begin(), seen.end(), k.verdict) == seen.end()) {
      seen.push_back(k.verdict);
      s += fmt::format("{}: {}\n", k.verdict, k.remedy);
    }
  return s;
}

std::string Profiler::overlap_summary() const {
  double comm = 0, exposed = 0;
  int64_t first = 0, last = 0;
  for (const auto& r : records_) {
    if (r.kind == trace::Kind::collective) comm += double(r.end_ns - r.begin_ns);
    if (r.kind == trace::Kind::annotation && r.name == "FSDP::wait")
      exposed += double(r.end_ns - r.begin_ns);
    if (r.kind != trace::Kind::counter) {
      first = first ? std::min(first, r.begin_ns) : r.begin_ns;
      last = std::max(last, r.end_ns);
    }
  }
  return fmt::format(
      "overlap | {:.1f} ms in collectives (comm threads) | {:.1f} ms exposed to compute ({:.0f}%) "
      "| "
      "{:.1f} ms profiled",
      comm / 1e6, exposed / 1e6, comm > 0 ? 100.0 * std::min(1.0, exposed / comm) : 0.0,
      double(last - first) / 1e6);
}

}  // namespace fsdp::profiler
