// The table of environment knobs. Add new knobs here, nowhere else.
#include "fsdp/core/env.h"

#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "fsdp/core/error.h"

namespace fsdp {

const std::vector<EnvKnob>& env_knobs() {
  static const std::vector<EnvKnob> knobs = {
      {"FSDP_BACKEND", "",
       "process group backend: mpi, gloo, nccl or local (default: from the launcher and the "
       "device)",
       EnvKind::choice, 0, 0, "mpi|gloo|nccl|local"},
      {"FSDP_STORE_PORT", "",
       "port of our rendezvous store (default MASTER_PORT; MASTER_PORT+1 when torchrun's agent "
       "serves its own store there)",
       EnvKind::integer, 1, 65535},
      {"FSDP_STORE_TIMEOUT_S", "300", "seconds the rendezvous store waits for ranks and keys",
       EnvKind::seconds, 0, 1e6},
      {"FSDP_RUN_ID", "",
       "the job's rendezvous id (fsdprun sets one per launch; torchrun's TORCHELASTIC_RUN_ID is "
       "used when this is empty): a rank of another run at the same store is refused by name"},
      {"FSDP_COLLECTIVE_TIMEOUT_S", "600",
       "seconds Work::wait() waits before calling a collective stuck", EnvKind::seconds, 0, 1e6},
      {"FSDP_DIST_CHECK", "1",
       "1: compare each collective's kind, dtype and sizes across ranks first; 0: skip",
       EnvKind::flag},
      {"FSDP_DIST_DEVICE_CHECK", "0",
       "1 (tests): a CPU world runs as a device + host group whose device half refuses every "
       "tensor, so a host tensor that would reach NCCL fails on a machine without a GPU",
       EnvKind::flag},
      {"FSDP_GLOO_HOSTNAME", "",
       "address Gloo listens on (default: 127.0.0.1 when MASTER_ADDR is local, else this host's "
       "address on the route to MASTER_ADDR)"},
      {"FSDP_SOCKET_IFNAME", "",
       "interface whose IPv4 address Gloo listens on (as GLOO_SOCKET_IFNAME, which wins)"},
      {"FSDP_BLAS_REEXEC", "1",
       "1: where OpenBLAS fell back to generic kernels on a CPU newer than it, the binaries "
       "re-execute with OPENBLAS_CORETYPE set to better ones (ops/blas.h); 0: keep OpenBLAS's "
       "choice; 2 (tests): also when OPENBLAS_CORETYPE named the generic kernels",
       EnvKind::integer, 0, 2},
      {"FSDP_BF16_GEMM", "1",
       "GEMMs of bf16 operands (kernels/cpu/gemm_bf16.cpp): 1: on AMX's tiles where the CPU "
       "has them, else on AVX512_BF16's dot products; 2: on AVX512_BF16's dot products; 0: in "
       "f32 on widened copies",
       EnvKind::integer, 0, 2},
      {"FSDP_BLAS_REEXEC_FROM", "",
       "set by the binaries, not by hand: the generic kernels OpenBLAS chose before they "
       "re-executed with better ones"},
      {"FSDP_CACHE_DIR", "",
       "where measured machine ceilings and data hashes are cached (default "
       "$XDG_CACHE_HOME/fsdp or ~/.cache/fsdp)"},
      {"FSDP_CKPT_SLOW_WRITE_MS", "0",
       "tests only: pause this long while writing each checkpoint shard", EnvKind::number, 0, 1e7},
      {"FSDP_CKPT_HOLD_WRITE", "",
       "tests only: a path; each rank's checkpoint shard write writes its pid to PATH.held.RANK, "
       "then waits until PATH exists"},
      {"FSDP_CPU_CACHE_MB", "2048",
       "most MiB of freed large CPU blocks the allocator keeps for reuse", EnvKind::number, 0, 1e9},
      {"FSDP_ONE_RANK_CAST", "1",
       "0: one rank with another compute or reduce dtype takes the collectives' path (tests "
       "compare the two)",
       EnvKind::flag},
      {"FSDP_CUDA_POISON", "0",
       "1: fill every CUDA block handed out with 0xFF (NaN), to catch unwritten outputs",
       EnvKind::flag},
      {"FSDP_CUDA_TF32", "0", "1: let f32 GEMMs on CUDA use TF32 tensor cores", EnvKind::flag},
      {"FSDP_GEMM_TUNE", "8",
       "CUDA GEMMs: time this many of cuBLASLt's candidates per shape on first use, keep the "
       "fastest (1: the heuristic's first)",
       EnvKind::integer, 1, 1000},
      {"FSDP_CUDNN_ATTENTION", "1",
       "0: use our own CUDA attention kernel instead of cuDNN's fused SDPA (bf16/f16)",
       EnvKind::flag},
      {"FSDP_GEMM_PEAK_GFLOPS", "0",
       "fp32 GEMM peak to measure MFU against, in GFLOP/s; 0 measures it once and caches it",
       EnvKind::number, 0, 1e12},
      {"FSDP_GEMM_PEAK_REMEASURE", "0",
       "1: measure the GEMM peak again and replace the cached one (a cached peak is otherwise "
       "only raised, by rates a run observes)",
       EnvKind::flag},
  };
  return knobs;
}

static const EnvKnob& knob(const char* name) {
  for (const EnvKnob& k : env_knobs())
    if (std::string_view(k.name) == name) return k;
  FSDP_FAIL("[env] '{}' is not a declared knob (see src/core/env.cpp)", name);
}

std::string env_str(const char* name) {
  const EnvKnob& k = knob(name);
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string(k.default_value);
}

namespace {

// What the knob's value must be, in words.
std::string expected(const EnvKnob& k) {
  switch (k.kind) {
    case EnvKind::text: return "any text";
    case EnvKind::choice: return fmt::format("one of {}", k.choices);
    case EnvKind::flag: return "0 or 1";
    case EnvKind::integer: return fmt::format("a whole number from {:g} to {:g}", k.min, k.max);
    case EnvKind::number: return fmt::format("a finite number from {:g} to {:g}", k.min, k.max);
    case EnvKind::seconds:
      return fmt::format("a finite number of seconds above 0 and at most {:g}", k.max);
  }
  return "";
}

// The value checked against the knob's kind and range; NaN for text and choices.
double checked(const EnvKnob& k, const std::string& s) {
  if (k.kind == EnvKind::text) return std::nan("");
  auto refuse = [&]() {
    FSDP_FAIL("[env] {}='{}' is not valid: expected {}", k.name, s, expected(k));
  };
  if (k.kind == EnvKind::choice) {
    if (s.empty() && std::string_view(k.default_value).empty()) return std::nan("");
    std::string_view all = k.choices;
    for (size_t b = 0; b <= all.size();) {
      size_t e = all.find('|', b);
      if (e == std::string_view::npos) e = all.size();
      if (all.substr(b, e - b) == s) return std::nan("");
      b = e + 1;
    }
    refuse();
  }
  if (s.empty() && std::string_view(k.default_value).empty()) return std::nan("");  // unset
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || !end || *end != '\0' || std::isspace(static_cast<unsigned char>(s[0])) ||
      !std::isfinite(v))
    refuse();
  switch (k.kind) {
    case EnvKind::flag:
      if (s != "0" && s != "1") refuse();
      break;
    case EnvKind::integer:
      if (v != std::floor(v) || v < k.min || v > k.max) refuse();
      break;
    case EnvKind::number:
      if (v < k.min || v > k.max) refuse();
      break;
    case EnvKind::seconds:
      if (!(v > 0) || v > k.max) refuse();
      break;
    default: break;
  }
  return v;
}

}  // namespace

double env_double(const char* name) {
  const EnvKnob& k = knob(name);
  const std::string s = env_str(name);
  if (k.kind == EnvKind::text || k.kind == EnvKind::choice) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    FSDP_CHECK(!s.empty() && end && *end == '\0' && std::isfinite(v),
               "[env] {}='{}' is not a number", name, s);
    return v;
  }
  return checked(k, s);
}

void validate_env() {
  for (const EnvKnob& k : env_knobs())
    if (const char* v = std::getenv(k.name)) checked(k, v);
}

std::string cache_dir() {
  std::string d = env_str("FSDP_CACHE_DIR");
  if (!d.empty()) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return (std::filesystem::path(x) / "fsdp").string();
  if (const char* h = std::getenv("HOME"))
    return (std::filesystem::path(h) / ".cache" / "fsdp").string();
  return (std::filesystem::temp_directory_path() / "fsdp-cache").string();
}

}  // namespace fsdp
