// Measures and caches the sgemm peak. The cache is a small JSON file keyed by
// CPU model and thread count; FSDP_GEMM_PEAK_GFLOPS overrides it.
#include "fsdp/ops/peak.h"

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

namespace fsdp::ops {

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

}  // namespace

double sgemm_peak_flops(int threads) {
  double forced = env_double("FSDP_GEMM_PEAK_GFLOPS");
  if (forced > 0) return forced * 1e9;
  const std::string key = fmt::format("{} x{}", cpu_model(), threads);
  const auto path = cache_dir() / "sgemm_peak.json";
  nlohmann::json cache = nlohmann::json::object();
  {
    std::ifstream in(path);
    if (in) {
      try {
        in >> cache;
      } catch (const nlohmann::json::exception&) {
        cache = nlohmann::json::object();  // a damaged cache is re-measured, not fatal
      }
    }
  }
  if (cache.is_object() && cache.contains(key) && cache[key].is_number())
    return cache[key].get<double>();

  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  double flops = kernels::cpu::measure_sgemm_flops(1536, 4);
  omp_set_num_threads(saved);

  cache[key] = flops;
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  const auto tmp = path.string() + fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream out(tmp);
    out << cache.dump(2) << "\n";
  }
  std::filesystem::rename(tmp, path, ec);  // atomic; a failure only costs a re-measure next time
  if (ec) std::filesystem::remove(tmp, ec);
  return flops;
}

double device_gemm_peak_flops(Device device, DType dtype) {
  FSDP_CHECK(device.is_cuda(), "[peak] device_gemm_peak_flops needs a CUDA device, got {}",
             device.str());
  return cuda_impl::gemm_peak_flops(device, dtype);
}

double device_copy_gbps(Device device) {
  FSDP_CHECK(device.is_cuda(), "[peak] device_copy_gbps needs a CUDA device, got {}", device.str());
  return cuda_impl::copy_gbps(device);
}

}  // namespace fsdp::ops
