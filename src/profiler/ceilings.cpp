// Measures, caches and raises the GEMM peaks. The caches are small JSON objects
// under FSDP_CACHE_DIR, one number (FLOP/s) per key: the sgemm peak keyed by CPU
// model and thread count, a CUDA device's by the GPU's name and the dtype. One
// policy for both: a cached peak only goes up (an observed rate above it), a
// bad entry or file is named and measured again, FSDP_GEMM_PEAK_REMEASURE=1
// measures again and replaces the entry (the one way down).
#include "fsdp/profiler/ceilings.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "fsdp/core/env.h"
#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "kernels/cpu/cpu_kernels.h"
#include "src/core/json_read.h"
#include "src/ops/backend.h"

namespace fsdp::profiler {

namespace {

using json = nlohmann::json;

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

std::filesystem::path cache_dir() { return fsdp::cache_dir(); }

bool valid_peak(const json& v) {
  return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0;
}

// The cache as a JSON object of valid entries. A file that does not parse, is not an object, or
// holds an entry that is not a positive number is named on stderr and that part measured again
// (a damaged cache must neither stop a run nor set its MFU).
json read_cache(const std::string& path) {
  std::ifstream in(path);
  if (!in) return json::object();  // none yet
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // nested past the limit: damaged like text that does not parse (a dump would recurse per level)
  json cache = json_read::depth_error(text).empty() ? json::parse(text, nullptr, false)
                                                    : json(json::value_t::discarded);
  if (cache.is_discarded() || !cache.is_object()) {
    fmt::print(stderr,
               "[ceilings] the peak cache '{}' is not a JSON object of FLOP/s ({} bytes: '{}'); "
               "ignoring it and measuring again\n",
               path, text.size(), text.substr(0, 40));
    return json::object();
  }
  for (auto it = cache.begin(); it != cache.end();) {
    if (valid_peak(*it)) {
      ++it;
      continue;
    }
    fmt::print(stderr,
               "[ceilings] the peak cache '{}' holds {} for '{}', not a positive number of "
               "FLOP/s; measuring it again\n",
               path, json_read::brief(*it, 40), it.key());
    it = cache.erase(it);
  }
  return cache;
}

// Rewrites the cache whole (a temporary renamed over it). A cache that cannot be written costs
// a measurement next time, said on stderr; it does not stop the run.
void write_cache(const std::string& path, const json& cache) {
  try {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    write_file_atomic(path, cache.dump(2) + "\n", "[ceilings]", false);
  } catch (const std::exception& e) {
    fmt::print(stderr, "[ceilings] the peak was not cached: {}\n", e.what());
  }
}

bool remeasure() { return env_double("FSDP_GEMM_PEAK_REMEASURE") != 0; }

// The cached entry at `key` if there is one (and no refresh was asked for), else measure() cached.
template <class Measure>
double cached_or_measured(const std::string& path, const std::string& key, Measure measure) {
  json cache = read_cache(path);
  if (!remeasure() && cache.contains(key)) return cache[key].get<double>();
  const double flops = measure();
  if (flops > 0 && std::isfinite(flops)) {
    cache[key] = flops;
    write_cache(path, cache);
  }
  return flops;
}

// max(cached, observed); the cache raised to `observed` when it is higher. An absent entry is
// left to a measurement (an observed rate is a lower bound, not a peak).
double raise_cached(const std::string& path, const std::string& key, double observed) {
  if (!(observed > 0) || !std::isfinite(observed)) observed = 0;
  json cache = read_cache(path);
  if (!cache.contains(key)) return observed;
  const double cached = cache[key].get<double>();
  if (observed <= cached) return cached;
  cache[key] = observed;
  write_cache(path, cache);
  return observed;
}

// The CPU, the threads and the BLAS's kernels (ops/blas.h: a generic fallback runs at a
// fraction); a library other than Debian's OpenBLAS is named too (the keys before there was a
// choice stay valid).
std::string sgemm_key(int threads) {
  const std::string library = kernels::cpu::blas_library();
  return fmt::format("{} x{} {}{}", cpu_model(), threads,
                     library == "openblas" ? "" : library + " ", kernels::cpu::blas_core_name());
}

std::string device_key(Device device, DType dtype, std::string* name) {
  *name = ops::cuda_impl::device_name(device);  // "": nothing is cached
  return fmt::format("{} {}", *name, dtype_name(dtype));
}

}  // namespace

std::string sgemm_peak_cache_path() { return (cache_dir() / "sgemm_peak.json").string(); }
std::string device_gemm_peak_cache_path() {
  return (cache_dir() / "device_gemm_peak.json").string();
}

double sgemm_peak_flops(int threads, const std::vector<GemmShape>& shapes) {
  const double forced = env_double("FSDP_GEMM_PEAK_GFLOPS");
  if (forced > 0) return forced * 1e9;
  return cached_or_measured(sgemm_peak_cache_path(), sgemm_key(threads), [&] {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    // The best of 5 at a large square (where BLAS reaches its peak), then of 3 at each of the
    // model's shapes with its rows capped at 2 GFLOP a product (a few tens of ms each).
    double best = kernels::cpu::measure_sgemm_flops(2048, 2048, 2048, 5);
    std::vector<GemmShape> seen;
    for (GemmShape s : shapes) {
      if (s.m <= 0 || s.n <= 0 || s.k <= 0) continue;
      s.m = std::max<int64_t>(1, std::min<int64_t>(s.m, int64_t(1e9 / double(s.n * s.k))));
      if (std::any_of(seen.begin(), seen.end(),
                      [&](const GemmShape& o) { return o.m == s.m && o.n == s.n && o.k == s.k; }))
        continue;
      seen.push_back(s);
      best = std::max(best, kernels::cpu::measure_sgemm_flops(s.m, s.n, s.k, 3));
    }
    omp_set_num_threads(saved);
    return best;
  });
}

double raise_sgemm_peak(int threads, double observed_flops) {
  const double forced = env_double("FSDP_GEMM_PEAK_GFLOPS");
  if (forced > 0) return std::max(forced * 1e9, observed_flops);
  return raise_cached(sgemm_peak_cache_path(), sgemm_key(threads), observed_flops);
}

double device_gemm_peak_flops(Device device, DType dtype) {
  FSDP_CHECK(device.is_cuda(), "[ceilings] device_gemm_peak_flops needs a CUDA device, got {}",
             device.str());
  // Measured once per machine: every training process asks (1-2 s of tuned 8192^3 GEMMs).
  std::string name;
  const std::string key = device_key(device, dtype, &name);
  auto measure = [&] { return ops::cuda_impl::gemm_peak_flops(device, dtype); };
  if (name.empty()) return measure();
  return cached_or_measured(device_gemm_peak_cache_path(), key, measure);
}

double raise_device_gemm_peak(Device device, DType dtype, double observed_flops) {
  std::string name;
  const std::string key = device_key(device, dtype, &name);
  if (name.empty()) return observed_flops;
  return raise_cached(device_gemm_peak_cache_path(), key, observed_flops);
}

double device_copy_gbps(Device device) {
  FSDP_CHECK(device.is_cuda(), "[ceilings] device_copy_gbps needs a CUDA device, got {}",
             device.str());
  return ops::cuda_impl::copy_gbps(device);
}

}  // namespace fsdp::profiler
