// The CPU GEMM's library (chosen at build time by measurement, cmake/blas.cmake: MKL, OpenBLAS,
// PyPI's scipy-openblas or BLIS): its name, the kernels it runs, and, for Debian's OpenBLAS,
// better ones where it fell back.
//
// OpenBLAS chooses its kernels once, as it loads, from the CPU's model. A CPU newer than the
// library gets a generic SSE kernel: Debian 12's OpenBLAS 0.3.21 knows no Sapphire or Emerald
// Rapids Xeon and no Zen 4, runs Prescott's kernels there, and fsdp-train's steps took 3.4x as
// long as with SkylakeX's (bench/results/cpu-tiny*.md). OPENBLAS_CORETYPE names the kernels to
// use instead, but only before the library loads: so a binary calls use_best_blas_kernel(argv)
// first thing in main(), and it re-executes itself with the variable set when that helps. The
// other libraries know this generation (scipy-openblas 0.3.34, BLIS's zen3 and skx
// configurations, MKL): with them nothing re-executes.
#pragma once

#include <string>

namespace fsdp::ops {

// The library and its version, for a run's table: "openblas 0.3.21", "blis 0.9.0", "mkl 2026.2".
std::string blas_library();

// The kernels the library runs, as it names them ("SkylakeX", "Haswell", "Prescott" for
// OpenBLAS; "zen3" for BLIS).
std::string blas_kernel();

// Better kernels than OpenBLAS's generic fallback that this CPU runs: "SkylakeX" (AVX-512 F, BW,
// VL, DQ and CD) or "Haswell" (AVX2 and FMA); "" when OpenBLAS chose a CPU-specific kernel itself,
// the CPU has neither, or the library is not Debian's OpenBLAS.
std::string blas_better_kernel();

// When blas_better_kernel() names one, OPENBLAS_CORETYPE is unset, FSDP_BLAS_REEXEC is 1 (2 also
// overrides an OPENBLAS_CORETYPE naming generic kernels, for tests) and this process was not
// re-executed already: sets OPENBLAS_CORETYPE to it and re-executes this program
// (/proc/self/exe, the same argv and process: launchers and MPI see nothing), noting the kernels
// it replaces in FSDP_BLAS_REEXEC_FROM. Otherwise, or if the exec fails (said on stderr),
// returns. Call it first in main(), before threads, MPI or files are opened.
void use_best_blas_kernel(char** argv);

// Whether GEMMs of bf16 operands run on this CPU's bf16 instructions, with f32 accumulation
// (kernels/cpu/gemm_bf16.cpp, our own: AMX's tiles where the CPU has them, else AVX512_BF16's dot
// products), rather than in f32 on widened copies: the CPU has AVX512_BF16 and FSDP_BF16_GEMM is
// not 0 (read once; 2 keeps to AVX512_BF16 where AMX is there too).
bool bf16_gemm_native();
// Which of the three runs, for the run's table: "AMX tiles, f32 sums", ...
std::string bf16_gemm_name();

// For a run's table: the kernels and how they were chosen, e.g. "SkylakeX (OpenBLAS chose
// Prescott)" after a re-execution, "SkylakeX (OPENBLAS_CORETYPE)" or "Haswell".
std::string blas_kernel_note();

}  // namespace fsdp::ops
