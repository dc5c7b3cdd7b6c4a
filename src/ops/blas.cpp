// The CPU BLAS library and its kernels; choosing OpenBLAS's (fsdp/ops/blas.h).
#include "fsdp/ops/blas.h"

#include <fmt/core.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>

#include "fsdp/core/env.h"
#include "kernels/cpu/cpu_kernels.h"

namespace fsdp::ops {

namespace {

// What OpenBLAS's DYNAMIC_ARCH build runs on a CPU model it does not know (by vendor and age).
bool is_generic(std::string_view core) {
  constexpr std::array<std::string_view, 9> kGeneric = {"Prescott",   "Core2",     "Penryn",
                                                        "Dunnington", "Nehalem",   "Atom",
                                                        "Opteron",    "Barcelona", "Katmai"};
  for (std::string_view g : kGeneric)
    if (core == g) return true;
  return false;
}

}  // namespace

std::string blas_kernel() { return kernels::cpu::blas_core_name(); }

std::string blas_library() {
  return fmt::format("{} {}", kernels::cpu::blas_library(), kernels::cpu::blas_version());
}

std::string blas_better_kernel() {
#if defined(__x86_64__) || defined(__i386__)
  // Only Debian's OpenBLAS (0.3.21) falls back to generic kernels on a CPU newer than it.
  if (std::string_view(kernels::cpu::blas_library()) != "openblas") return "";
  if (!is_generic(blas_kernel())) return "";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return "";
}

bool bf16_gemm_native() {
  static const bool on = [] {
    const double mode = env_double("FSDP_BF16_GEMM");
    if (!kernels::cpu::has_bf16_gemm() || mode == 0) return false;
    if (mode == 2) kernels::cpu::set_bf16_gemm_engine(kernels::cpu::Bf16Engine::avx512);
    return true;
  }();
  return on;
}

std::string bf16_gemm_name() {
  if (!bf16_gemm_native()) return "f32 on widened copies";
  return kernels::cpu::bf16_gemm_engine() == kernels::cpu::Bf16Engine::amx
             ? "AMX tiles, f32 sums"
             : "AVX512_BF16 dot products, f32 sums";
}

void use_best_blas_kernel(char** argv) {
  double mode = 1;
  try {
    mode = env_double("FSDP_BLAS_REEXEC");
  } catch (const std::exception&) {
    return;  // a bad value is the binary's validate_env()'s to name, as an error
  }
  // Re-executed through /proc/self/exe (the fallback below): take the program's name back.
  if (!env_str("FSDP_BLAS_REEXEC_FROM").empty() && argv && argv[0]) {
    std::array<char, 32> comm{};
    if (::prctl(PR_GET_NAME, comm.data()) == 0 && std::string_view(comm.data()) == "exe") {
      const std::string_view a0 = argv[0];
      const std::string base(
          a0.substr(a0.rfind('/') == std::string_view::npos ? 0 : a0.rfind('/') + 1));
      if (!base.empty()) ::prctl(PR_SET_NAME, base.substr(0, 15).c_str());
    }
  }
  // Once per process (an OpenBLAS that ignores the variable must not loop), and the user's
  // OPENBLAS_CORETYPE is theirs (mode 2 stands in for an unknown CPU in tests).
  if (mode == 0 || !env_str("FSDP_BLAS_REEXEC_FROM").empty() ||
      (std::getenv("OPENBLAS_CORETYPE") && mode != 2))
    return;
  const std::string better = blas_better_kernel();
  if (better.empty()) return;
  ::setenv("FSDP_BLAS_REEXEC_FROM", blas_kernel().c_str(), 1);
  ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  // The binary's own path, not /proc/self/exe: the kernel names a process after the file it
  // executes, so /proc/self/exe made every rank "exe" to ps, top, pgrep and a scheduler's
  // accounting. argv (argv[0] included) is passed on unchanged. A binary replaced or removed
  // since it started ("... (deleted)") is reached through /proc/self/exe, as before.
  std::array<char, 4096> self{};
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (n > 0 && size_t(n) < self.size() - 1 &&
      !std::string_view(self.data(), size_t(n)).ends_with(" (deleted)"))
    ::execv(self.data(), argv);
  ::execv("/proc/self/exe", argv);
  const int err = errno;  // only on failure: go on with the kernels there are
  std::fprintf(
      stderr,
      "fsdp: could not re-execute with OPENBLAS_CORETYPE=%s (%s); going on with OpenBLAS's "
      "%s kernels\n",
      better.c_str(), std::strerror(err), blas_kernel().c_str());
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv("FSDP_BLAS_REEXEC_FROM");
}

std::string blas_kernel_note() {
  const std::string from = env_str("FSDP_BLAS_REEXEC_FROM");
  if (!from.empty() && from != blas_kernel())
    return fmt::format("{} (OpenBLAS chose {})", blas_kernel(), from);
  if (std::getenv("OPENBLAS_CORETYPE")) return blas_kernel() + " (OPENBLAS_CORETYPE)";
  return blas_kernel();
}

}  // namespace fsdp::ops
