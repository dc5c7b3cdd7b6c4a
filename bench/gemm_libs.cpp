// sgemm (and, where the library has one, bf16 x bf16 -> f32 GEMM) GFLOP/s of one BLAS library,
// loaded with dlopen, at the shapes fsdp-train's models run: bench/gemm_libs.sh runs it once per
// library and thread count, in alternating rounds, and writes bench/results/gemm-libs-cpu.md.
//
// dlopen, not a link: one binary measures every candidate, each in its own process (two BLAS
// libraries in one process would share symbol names and thread pools). The library's own
// threading is set through its environment by the script (OMP_NUM_THREADS, and the library's
// variable); this program also calls the library's set-threads entry where it has one.
//
// Usage: fsdp-bench-gemm-libs LIBRARY.so PREFIX THREADS
//   PREFIX: "" for cblas_sgemm, "scipy_" for scipy-openblas's scipy_cblas_sgemm.
// Prints "kernels NAME", then one line per shape: "model layout m n k dtype gflops cpu_gflops"
// (GFLOP/s by the wall clock, and by the process's CPU time).
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

// CBLAS's enum values (cblas.h), fixed by the standard interface.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                       float, float*, int);
// MKL's cblas_gemm_bf16bf16f32 and OpenBLAS's cblas_sbgemm take the same arguments (bf16 as
// uint16_t).
using Bf16gemm = void (*)(int, int, int, int, int, int, float, const uint16_t*, int,
                          const uint16_t*, int, float, float*, int);

struct Shape {
  const char* model;
  char ta, tb;  // 'N' or 'T', row-major, as kernels/cpu/gemm.cpp calls it
  int m, n, k;
};

// Linear layers are y = x W^T (NT), dx = dy W (NN), dW = dy^T x (TN).
// tiny: dim 256, ffn 1024, vocab 4096, 8 x 256 tokens a step; attention per head 256 x 64.
// smollm2 (bench/finetune.sh): dim 576, kv 192, ffn 1536, vocab 49152, 2 x 256 tokens a rank.
const Shape kShapes[] = {
    {"tiny", 'N', 'T', 2048, 768, 256},     {"tiny", 'N', 'T', 2048, 256, 256},
    {"tiny", 'N', 'T', 2048, 1024, 256},    {"tiny", 'N', 'T', 2048, 256, 1024},
    {"tiny", 'N', 'T', 2048, 4096, 256},    {"tiny", 'N', 'N', 2048, 256, 4096},
    {"tiny", 'T', 'N', 4096, 256, 2048},    {"tiny", 'T', 'N', 1024, 256, 2048},
    {"tiny", 'N', 'N', 2048, 256, 1024},    {"tiny", 'N', 'T', 256, 256, 64},
    {"tiny", 'N', 'N', 256, 64, 256},       {"smollm2", 'N', 'T', 512, 576, 576},
    {"smollm2", 'N', 'T', 512, 192, 576},   {"smollm2", 'N', 'T', 512, 1536, 576},
    {"smollm2", 'N', 'T', 512, 576, 1536},  {"smollm2", 'N', 'N', 512, 576, 1536},
    {"smollm2", 'T', 'N', 1536, 576, 512},  {"smollm2", 'T', 'N', 576, 576, 512},
    {"smollm2", 'N', 'T', 512, 49152, 576}, {"smollm2", 'N', 'N', 512, 576, 49152},
    {"smollm2", 'T', 'N', 49152, 576, 512}, {"square", 'N', 'N', 2048, 2048, 2048},
};

void* sym(void* lib, const char* path, const std::string& name) {
  void* p = dlsym(lib, name.c_str());
  if (!p) {
    std::fprintf(stderr, "gemm_libs: %s has no symbol %s\n", path, name.c_str());
    std::exit(2);
  }
  return p;
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Seconds per call, wall clock and this process's CPU time (all its threads): the best of 3
// batches, each of enough calls for about 0.1 s. On a loaded machine the wall clock counts the
// time other processes held the cores; the CPU time does not, so at one thread it is the rate
// the library reaches when it has a core (cache and memory contention remain).
struct Timing {
  double wall = 1e30, cpu = 1e30;
};
template <class Call>
Timing seconds_per_call(Call call) {
  call();  // warm up (packing buffers, threads)
  const auto t0 = std::chrono::steady_clock::now();
  call();
  const double first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int calls = std::clamp(int(0.1 / std::max(first, 1e-6)), 1, 1000);
  Timing best;
  for (int r = 0; r < 3; ++r) {
    const double c0 = cpu_seconds();
    const auto s = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    best.wall = std::min(best.wall, wall / calls);
    best.cpu = std::min(best.cpu, (cpu_seconds() - c0) / calls);
  }
  return best;
}

std::string kernels_of(void* lib, const std::string& prefix) {
  using Name = const char* (*)();
  if (auto f = Name(dlsym(lib, (prefix + "openblas_get_corename").c_str()))) return f();
  if (auto q = (int (*)())dlsym(lib, "bli_arch_query_id")) {
    auto s = (const char* (*)(int))dlsym(lib, "bli_arch_string");
    return std::string("blis ") + (s ? s(q()) : "?");
  }
  if (auto v = (void (*)(char*, int))dlsym(lib, "mkl_get_version_string")) {
    char buf[256] = {};
    v(buf, sizeof buf);
    return buf;
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s LIBRARY.so PREFIX THREADS\n", argv[0]);
    return 2;
  }
  const std::string prefix = argv[2];
  const int threads = std::atoi(argv[3]);
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "gemm_libs: cannot load %s: %s\n", argv[1], dlerror());
    return 2;
  }
  auto sgemm = Sgemm(sym(lib, argv[1], prefix + "cblas_sgemm"));
  Bf16gemm bf16 = Bf16gemm(dlsym(lib, (prefix + "cblas_sbgemm").c_str()));
  if (!bf16) bf16 = Bf16gemm(dlsym(lib, "cblas_gemm_bf16bf16f32"));
  if (auto f = (void (*)(int))dlsym(lib, (prefix + "openblas_set_num_threads").c_str())) f(threads);
  if (auto f = (void (*)(int))dlsym(lib, "MKL_Set_Num_Threads")) f(threads);
  if (auto f = (void (*)(int64_t))dlsym(lib, "bli_thread_set_num_threads")) f(threads);
  std::printf("kernels %s\n", kernels_of(lib, prefix).c_str());

  for (const Shape& s : kShapes) {
    const int lda = s.ta == 'N' ? s.k : s.m, ldb = s.tb == 'N' ? s.n : s.k;
    std::vector<float> a(size_t(s.m) * s.k), b(size_t(s.k) * s.n), c(size_t(s.m) * s.n);
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 7) * 0.1f - 0.3f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(i % 5) * 0.1f - 0.2f;
    const double flops = 2.0 * s.m * s.n * s.k;
    const int ta = s.ta == 'N' ? kNoTrans : kTrans, tb = s.tb == 'N' ? kNoTrans : kTrans;
    const Timing sec = seconds_per_call([&] {
      sgemm(kRowMajor, ta, tb, s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(),
            s.n);
    });
    std::printf("%s %c%c %d %d %d f32 %.2f %.2f\n", s.model, s.ta, s.tb, s.m, s.n, s.k,
                flops / sec.wall / 1e9, flops / sec.cpu / 1e9);
    if (bf16) {
      std::vector<uint16_t> ab(a.size()), bb(b.size());
      for (size_t i = 0; i < a.size(); ++i) ab[i] = to_bf16(a[i]);
      for (size_t i = 0; i < b.size(); ++i) bb[i] = to_bf16(b[i]);
      const Timing sb = seconds_per_call([&] {
        bf16(kRowMajor, ta, tb, s.m, s.n, s.k, 1.f, ab.data(), lda, bb.data(), ldb, 0.f, c.data(),
             s.n);
      });
      std::printf("%s %c%c %d %d %d bf16 %.2f %.2f\n", s.model, s.ta, s.tb, s.m, s.n, s.k,
                  flops / sb.wall / 1e9, flops / sb.cpu / 1e9);
    }
    std::fflush(stdout);
  }
  return 0;
}
