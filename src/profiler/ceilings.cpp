// Measures and caches the GEMM peaks. The caches are small JSON files under
// FSDP_CACHE_DIR: the sgemm peak keyed by CPU model and thread count
// (FSDP_GEMM_PEAK_GFLOPS overrides it), a CUDA device's keyed by the GPU's
// name and the dtype.
#include "fsdp/profiler/ceilings.h"

#include <omp.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "fsdp/core/env.h"
#include "kernels/cpu/cpu_kernels.h"
#include "src/ops/backend.h"

namespace fsdp::profiler {

namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

std::filesystem::path cache_dir() {
  std::string d = env_str("FSDP_CACHE_DIR");
  if (!d.empty()) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::filesystem::path(x) / "fsdp";
  if (const char* h = std::getenv("HOME")) return std::filesystem::path(h) / ".cache" / "fsdp";
  return std::filesystem::temp_directory_path() / "fsdp-cache";
}

nlohmann::json read_cache(const std::filesystem::path& path) {
  nlohmann::json cache = nlohmann::json::object();
  std::ifstream in(path);
  if (in) {
    try {
      in >> cache;
    } catch (const nlohmann::json::exception&) {
      cache = nlohmann::json::object();  // a damaged cache is re-measured, not fatal
    }
  }
  if (!cache.is_object()) cache = nlohmann::json::object();
  return cache;
}

void write_cache(const std::filesystem::path& path, const nlohmann::json& cache) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  const auto tmp = path.string() + fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream out(tmp);
    out << cache.dump(2) << "\n";
  }
  std::filesystem::rename(tmp, path, ec);  // atomic; a failure only costs a re-measure next time
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

double sgemm_peak_flops(int threads) {
  double forced = env_double("FSDP_GEMM_PEAK_GFLOPS");
  if (forced > 0) return forced * 1e9;
  const std::string key = fmt::format("{} x{}", cpu_model(), threads);
  const auto path = cache_dir() / "sgemm_peak.json";
  nlohmann::json cache = read_cache(path);
  if (cache.contains(key) && cache[key].is_number()) return cache[key].get<double>();

  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  double flops = kernels::cpu::measure_sgemm_flops(1536, 4);
  omp_set_num_threads(saved);

  cache[key] = flops;
  write_cache(path, cache);
  return flops;
}

double device_gemm_peak_flops(Device device, DType dtype) {
  FSDP_CHECK(device.is_cuda(), "[peak] device_gemm_peak_flops needs a CUDA device, got {}",
             device.str());
  // Measured once per machine: every training process asks (1-2 s of tuned 8192^3 GEMMs).
  const std::string name = ops::cuda_impl::device_name(device);  // "": nothing is cached
  const std::string key = fmt::format("{} {}", name, dtype_name(dtype));
  const auto path = cache_dir() / "device_gemm_peak.json";
  nlohmann::json cache = name.empty() ? nlohmann::json::object() : read_cache(path);
  if (cache.contains(key) && cache[key].is_number() && cache[key].get<double>() > 0)
    return cache[key].get<double>();
  const double flops = ops::cuda_impl::gemm_peak_flops(device, dtype);
  if (!name.empty() && flops > 0) {
    cache[key] = flops;
    write_cache(path, cache);
  }
  return flops;
}

double device_copy_gbps(Device device) {
  FSDP_CHECK(device.is_cuda(), "[peak] device_copy_gbps needs a CUDA device, got {}", device.str());
  return ops::cuda_impl::copy_gbps(device);
}

}  // namespace fsdp::profiler
