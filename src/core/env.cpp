// The table of environment knobs. Add new knobs here, nowhere else.
#include "fsdp/core/env.h"

#include <cstdlib>
#include <string_view>

#include "fsdp/core/error.h"

namespace fsdp {

const std::vector<EnvKnob>& env_knobs() {
  static const std::vector<EnvKnob> knobs = {
      {"FSDP_BACKEND", "",
       "process group backend: mpi, gloo, nccl or local (default: from the launcher and the "
       "device)"},
      {"FSDP_STORE_PORT", "",
       "port of our rendezvous store (default MASTER_PORT; MASTER_PORT+1 when torchrun's agent "
       "serves its own store there)"},
      {"FSDP_STORE_TIMEOUT_S", "300", "seconds the rendezvous store waits for ranks and keys"},
      {"FSDP_RUN_ID", "",
       "the job's rendezvous id (fsdprun sets one per launch; torchrun's TORCHELASTIC_RUN_ID is "
       "used when this is empty): a rank of another run at the same store is refused by name"},
      {"FSDP_COLLECTIVE_TIMEOUT_S", "600",
       "seconds Work::wait() waits before calling a collective stuck"},
      {"FSDP_DIST_CHECK", "1",
       "1: compare each collective's kind, dtype and sizes across ranks first; 0: skip"},
      {"FSDP_DIST_DEVICE_CHECK", "0",
       "1 (tests): a CPU world runs as a device + host group whose device half refuses every "
       "tensor, so a host tensor that would reach NCCL fails on a machine without a GPU"},
      {"FSDP_GLOO_HOSTNAME", "",
       "address Gloo listens on (default: 127.0.0.1 when MASTER_ADDR is local, else this host's "
       "address on the route to MASTER_ADDR)"},
      {"FSDP_SOCKET_IFNAME", "",
       "interface whose IPv4 address Gloo listens on (as GLOO_SOCKET_IFNAME, which wins)"},
      {"FSDP_CACHE_DIR", "",
       "where measured machine ceilings are cached (default $XDG_CACHE_HOME/fsdp or "
       "~/.cache/fsdp)"},
      {"FSDP_CKPT_SLOW_WRITE_MS", "0",
       "tests only: pause this long while writing each checkpoint shard"},
      {"FSDP_CPU_CACHE_MB", "2048",
       "most MiB of freed large CPU blocks the allocator keeps for reuse"},
      {"FSDP_CUDA_POISON", "0",
       "1: fill every CUDA block handed out with 0xFF (NaN), to catch unwritten outputs"},
      {"FSDP_CUDA_TF32", "0", "1: let f32 GEMMs on CUDA use TF32 tensor cores"},
      {"FSDP_GEMM_TUNE", "8",
       "CUDA GEMMs: time this many of cuBLASLt's candidates per shape on first use, keep the "
       "fastest (1: the heuristic's first)"},
      {"FSDP_CUDNN_ATTENTION", "1",
       "0: use our own CUDA attention kernel instead of cuDNN's fused SDPA (bf16/f16)"},
      {"FSDP_GEMM_PEAK_GFLOPS", "0",
       "fp32 GEMM peak to measure MFU against, in GFLOP/s; 0 measures it once and caches it"},
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

double env_double(const char* name) {
  std::string s = env_str(name);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  FSDP_CHECK(!s.empty() && end && *end == '\0', "[env] {}='{}' is not a number", name, s);
  return v;
}

}  // namespace fsdp
