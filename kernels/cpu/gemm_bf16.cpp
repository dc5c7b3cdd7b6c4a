// A GEMM of bf16 inputs with f32 accumulation on AVX512_BF16 (VDPBF16PS), for --param-dtype bf16
// on CPUs that have it: none of the BLAS libraries the build takes has one that is faster than
// their f32 GEMM on this project's CPUs (bench/results/gemm-libs-cpu.md), so this is our own.
//
// The loops are GotoBLAS's: a panel of B (KC x NC) packed once and kept in L2/L3, a block of A
// (MC x KC) packed per thread and kept in L2, and a 12 x 32 micro-kernel whose 24 accumulators
// stay in registers. Packed operands hold k in pairs, as VDPBF16PS reads them: each 32-bit lane is
// (x[k], x[k+1]), so one instruction multiplies 16 lanes of 2 products each and adds both into
// the f32 lane. An odd k is padded with a zero. Every product of two bf16 values is exact in f32;
// the sums are in another order than an f32 GEMM's, and VDPBF16PS rounds to nearest even with
// denormals flushed, whatever MXCSR says.
//
// Threads: the A blocks (rows of C) are split over the OpenMP threads, each with its own packed A,
// and the B panel is packed by all of them together. Inside a parallel region it runs on the
// calling thread.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fsdp/core/error.h"
#include "kernels/cpu/cpu_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace fsdp::kernels::cpu {

#if defined(__x86_64__)
namespace {

constexpr int64_t kMR = 12, kNR = 32;
constexpr int64_t kKC = 384;   // k per packed block (even): a B micro-panel is 24 KB, in L1
constexpr int64_t kMC = 384;   // rows of A per block (a multiple of kMR): 288 KB, in L2
constexpr int64_t kNC = 4096;  // columns of B per panel (a multiple of kNR): 3 MB

inline uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

// A's rows [i0, i0 + mc) and k [k0, k0 + kc) -> panels of kMR rows, each kp-major: panel p holds
// at [kp * kMR + r] the pair (A(i0 + p*kMR + r, k0 + 2kp), A(.., k0 + 2kp + 1)); rows past mc are 0.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_a(bool ta, const uint16_t* a,
                                                                  int64_t lda, int64_t i0,
                                                                  int64_t mc, int64_t k0,
                                                                  int64_t kc, uint32_t* out) {
  const int64_t kp_n = (kc + 1) / 2;
  for (int64_t p = 0; p < mc; p += kMR) {
    uint32_t* dst = out + (p / kMR) * kp_n * kMR;
    const int64_t rows = std::min(kMR, mc - p);
    if (ta) {  // A(i, k) = a[k * lda + i]: the panel's rows are contiguous in each of a's rows, so
               // a pair is two of a's rows interleaved, kMR lanes at a time
      const __mmask16 m = __mmask16((1u << rows) - 1);
      for (int64_t kp = 0; kp < kp_n; ++kp) {
        const uint16_t* r0 = a + (k0 + 2 * kp) * lda + i0 + p;
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0));
        const __m512i hi = 2 * kp + 1 < kc
                               ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + lda))
                               : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(dst + kp * kMR, __mmask16((1u << kMR) - 1),
                                 _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
      continue;
    }
    for (int64_t r = 0; r < kMR; ++r) {
      if (r >= rows) {
        for (int64_t kp = 0; kp < kp_n; ++kp) dst[kp * kMR + r] = 0;
        continue;
      }
      const uint16_t* row = a + (i0 + p + r) * lda + k0;
      for (int64_t kp = 0; kp < kc / 2; ++kp) {
        uint32_t v;
        std::memcpy(&v, row + 2 * kp, 4);
        dst[kp * kMR + r] = v;
      }
      if (kc % 2) dst[(kc / 2) * kMR + r] = pair(row[kc - 1], 0);
    }
  }
}

// r[0..16) as a 16 x 16 matrix of dwords, transposed in place: r[c][q] <- r[q][c].
__attribute__((target("avx512f"))) inline void transpose16(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // t[i]: rows i, i+1 interleaved by dword (lo, hi halves)
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + q]: in each 128-bit lane L, column 4L + q of rows i..i+3
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int q = 0; q < 4; ++q) {  // columns q, 4 + q, 8 + q, 12 + q from the lanes of u[q + 4g]
    const __m512i v0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x88);
    const __m512i w0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xdd);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xdd);
    r[q] = _mm512_shuffle_i32x4(v0, v1, 0x88);
    r[8 + q] = _mm512_shuffle_i32x4(v0, v1, 0xdd);
    r[4 + q] = _mm512_shuffle_i32x4(w0, w1, 0x88);
    r[12 + q] = _mm512_shuffle_i32x4(w0, w1, 0xdd);
  }
}

// B's k [k0, k0 + kc) and columns [j0 + q*kNR, ..) -> micro-panel q, kp-major: [kp * kNR + j] is
// the pair (B(k0 + 2kp, j), B(k0 + 2kp + 1, j)); columns past nc are 0.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_b_panel(bool tb, const uint16_t* b,
                                                               int64_t ldb, int64_t k0, int64_t kc,
                                                               int64_t j0, int64_t cols,
                                                               uint32_t* dst) {
  const int64_t kp_n = (kc + 1) / 2;
  if (!tb) {  // rows of B are contiguous in j: interleave rows 2kp and 2kp + 1, 16 columns a time
    for (int64_t kp = 0; kp < kp_n; ++kp) {
      const uint16_t* r0 = b + (k0 + 2 * kp) * ldb + j0;
      const uint16_t* r1 = 2 * kp + 1 < kc ? r0 + ldb : nullptr;
      for (int64_t j = 0; j < kNR; j += 16) {
        const int64_t n = std::clamp<int64_t>(cols - j, 0, 16);
        const __mmask16 m = n == 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + j));
        const __m512i hi = r1 ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r1 + j))
                              : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + kp * kNR + j, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
    }
    return;
  }
  // B(k, j) = b[j * ldb + k]: a column's pairs are contiguous, so 16 columns x 16 pairs are read
  // as 16 rows of 16 dwords and transposed in registers; columns past `cols` read as 0.
  const int64_t full = kc / 2;
  for (int64_t j = 0; j < kNR; j += 16) {
    const uint16_t* base = b + (j0 + j) * ldb + k0;
    const int64_t n = std::clamp<int64_t>(cols - j, 0, 16);
    for (int64_t kp = 0; kp < full; kp += 16) {
      const int64_t t = std::min<int64_t>(16, full - kp);
      const __mmask16 km = t == 16 ? __mmask16(0xFFFF) : __mmask16((1u << t) - 1);
      __m512i r[16];
      for (int q = 0; q < 16; ++q)
        r[q] = q < n ? _mm512_maskz_loadu_epi32(km, base + q * ldb + 2 * kp)
                     : _mm512_setzero_si512();
      transpose16(r);
      for (int64_t q = 0; q < t; ++q) _mm512_storeu_si512(dst + (kp + q) * kNR + j, r[q]);
    }
    if (kc % 2)  // the last pair: (B(kc-1, j), 0)
      for (int64_t q = 0; q < 16; ++q) dst[full * kNR + j + q] = q < n ? base[q * ldb + kc - 1] : 0;
  }
}

// A row of up to 32 columns of C from its two accumulators: alpha * acc + (first ? beta * C : C);
// beta 0 on the first k block never reads C. Both micro-kernels end with it.
struct Epilogue {
  __m512 va, vb;
  __mmask16 m0, m1;
  bool read_c, first;
  __attribute__((target("avx512f"))) Epilogue(int64_t cols, float alpha, float beta, bool first_)
      : va(_mm512_set1_ps(alpha)), vb(_mm512_set1_ps(beta)), read_c(!first_ || beta != 0.0f),
        first(first_) {
    const int64_t n0 = std::min<int64_t>(cols, 16), n1 = std::clamp<int64_t>(cols - 16, 0, 16);
    m0 = n0 == 16 ? __mmask16(0xFFFF) : __mmask16((1u << n0) - 1);
    m1 = n1 == 16 ? __mmask16(0xFFFF) : __mmask16((1u << n1) - 1);
  }
  __attribute__((target("avx512f"))) void store(float* cr, __m512 acc0, __m512 acc1) const {
    __m512 y0 = _mm512_mul_ps(acc0, va), y1 = _mm512_mul_ps(acc1, va);
    if (read_c) {
      const __m512 s = first ? vb : _mm512_set1_ps(1.0f);
      y0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, cr), s, y0);
      y1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, cr + 16), s, y1);
    }
    _mm512_mask_storeu_ps(cr, m0, y0);
    if (m1) _mm512_mask_storeu_ps(cr + 16, m1, y1);
  }
};

// C[0:rows, 0:cols] (row stride ldc) = alpha * Ap Bp + (first ? beta * C : C), over kp_n pairs.
__attribute__((target("avx512f,avx512bf16"))) void micro_kernel(
    int64_t kp_n, const uint32_t* ap, const uint32_t* bp, float* c, int64_t ldc, int64_t rows,
    int64_t cols, float alpha, float beta, bool first) {
  __m512 acc[kMR][2];
#pragma GCC unroll 12
  for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kp_n; ++kp) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + kp * kNR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + kp * kNR + 16);
    const uint32_t* a = ap + kp * kMR;
#pragma GCC unroll 12
    for (int r = 0; r < kMR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  const Epilogue e(cols, alpha, beta, first);
  for (int r = 0; r < rows; ++r) e.store(c + r * ldc, acc[r][0], acc[r][1]);
}

// ---- AMX (TDPBF16PS) ----
// On CPUs with AMX's tiles (Sapphire Rapids and later), one TDPBF16PS multiplies a 16 x 32 bf16
// tile of A by a 32 x 16 tile of B (held as 16 rows of k pairs, the layout pack_b_panel writes)
// into a 16 x 16 f32 tile: 16 times the products of a VDPBF16PS. The micro-kernel keeps a 32 x 32
// block of C in four tiles, with two tiles of A and two of B. A is packed row-major in k pairs,
// k padded with zeros to whole tiles (32), rows to whole blocks (32); B's panels are padded alike.
// Products are exact and the sums f32, rounded to nearest even with denormals flushed, as
// VDPBF16PS's, in another order.
constexpr int64_t kAmxM = 32;    // rows of C per micro-kernel (two A tiles)
constexpr int64_t kAmxKC = 768;  // most k per packed block (k is split into equal blocks)
constexpr int64_t kAmxMC = 256;  // rows of A per block: up to 384 KB packed (k 768)

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// A's rows [i0, i0 + mc) and k [k0, k0 + kc) -> [row][kp] dwords, kp_pad (a multiple of 16) pairs
// per row, rows up to round_up(mc, kAmxM); padding is 0.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_a_rows(bool ta, const uint16_t* a,
                                                                       int64_t lda, int64_t i0,
                                                                       int64_t mc, int64_t k0,
                                                                       int64_t kc, int64_t kp_pad,
                                                                       uint32_t* out) {
  const int64_t rows_pad = round_up(mc, kAmxM), kp_n = (kc + 1) / 2;
  if (!ta) {  // A(i, k) = a[i * lda + k]: a row's pairs are contiguous
    for (int64_t r = 0; r < rows_pad; ++r) {
      uint32_t* dst = out + r * kp_pad;
      if (r >= mc) {
        std::memset(dst, 0, size_t(kp_pad) * 4);
        continue;
      }
      const uint16_t* row = a + (i0 + r) * lda + k0;
      std::memcpy(dst, row, size_t(kc / 2) * 4);
      if (kc % 2) dst[kc / 2] = pair(row[kc - 1], 0);
      std::memset(dst + kp_n, 0, size_t(kp_pad - kp_n) * 4);
    }
    return;
  }
  // A(i, k) = a[k * lda + i]: 16 rows' pairs at one kp are two of a's rows interleaved; 16 kp of
  // them are transposed in registers into 16 rows of 16 pairs.
  for (int64_t p = 0; p < rows_pad; p += 16) {
    const int64_t rows = std::clamp<int64_t>(mc - p, 0, 16);
    const __mmask16 m = rows == 16 ? __mmask16(0xFFFF) : __mmask16((1u << rows) - 1);
    for (int64_t kp0 = 0; kp0 < kp_pad; kp0 += 16) {
      __m512i r[16];
      for (int q = 0; q < 16; ++q) {
        const int64_t kp = kp0 + q;
        if (kp >= kp_n || rows == 0) {
          r[q] = _mm512_setzero_si512();
          continue;
        }
        const uint16_t* r0 = a + (k0 + 2 * kp) * lda + i0 + p;
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0));
        const __m512i hi = 2 * kp + 1 < kc
                               ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + lda))
                               : _mm512_setzero_si512();
        r[q] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
      }
      transpose16(r);  // r[row]: that row's 16 pairs
      for (int q = 0; q < 16; ++q) _mm512_storeu_si512(out + (p + q) * kp_pad + kp0, r[q]);
    }
  }
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// C[0:rows, 0:cols] = alpha * Ap Bp + (first ? beta * C : C) over kp_pad pairs: Ap is 32 packed
// rows (stride kp_pad), Bp a micro-panel (stride kNR). Tiles 0-3: C; 4, 5: A; 6, 7: B.
__attribute__((target("amx-tile,amx-bf16,avx512f"))) void amx_kernel(
    int64_t kp_pad, const uint32_t* ap, const uint32_t* bp, float* c, int64_t ldc, int64_t rows,
    int64_t cols, float alpha, float beta, bool first) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t sa = kp_pad * 4;
  for (int64_t kp = 0; kp < kp_pad; kp += 16) {
    _tile_loadd(4, ap + kp, sa);
    _tile_loadd(5, ap + 16 * kp_pad + kp, sa);
    _tile_loadd(6, bp + kp * kNR, kNR * 4);
    _tile_loadd(7, bp + kp * kNR + 16, kNR * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float acc[kAmxM][kNR];
  _tile_stored(0, &acc[0][0], kNR * 4);
  _tile_stored(1, &acc[0][16], kNR * 4);
  _tile_stored(2, &acc[16][0], kNR * 4);
  _tile_stored(3, &acc[16][16], kNR * 4);
  const Epilogue e(cols, alpha, beta, first);
  for (int64_t r = 0; r < rows; ++r)
    e.store(c + r * ldc, _mm512_load_ps(&acc[r][0]), _mm512_load_ps(&acc[r][16]));
}

__attribute__((target("amx-tile"))) void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}
__attribute__((target("amx-tile"))) void amx_release() { _tile_release(); }

void gemm_bf16_amx(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                   float* c, int64_t ldc) {
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t per_thread = (m + threads - 1) / threads;
  const int64_t mc_max = std::min(kAmxMC, round_up(per_thread, kAmxM));
  const int64_t nc_max = std::min(kNC, round_up(n, kNR));
  // k in equal blocks of at most kAmxKC, whole tiles: one pass over C where k fits (each pass
  // after the first reads C back and adds), and the blocks' A and B panels of like size.
  const int64_t k_blocks = (k + kAmxKC - 1) / kAmxKC;
  const int64_t kc_max = round_up((k + k_blocks - 1) / k_blocks, 32);
  const int64_t kp_max = kc_max / 2;
  thread_local std::vector<uint32_t> b_pack;
  b_pack.resize(size_t(nc_max * kp_max));
  uint32_t* bp = b_pack.data();
#pragma omp parallel num_threads(threads)
  {
    thread_local std::vector<uint32_t> a_pack;
    a_pack.resize(size_t(mc_max * kp_max));
    amx_configure();
    for (int64_t jc = 0; jc < n; jc += kNC) {
      const int64_t nc = std::min(kNC, n - jc), panels = (nc + kNR - 1) / kNR;
      for (int64_t pc = 0; pc < k; pc += kc_max) {
        const int64_t kc = std::min(kc_max, k - pc), kp_n = (kc + 1) / 2,
                      kp_pad = round_up(kp_n, 16);
#pragma omp for schedule(static)
        for (int64_t q = 0; q < panels; ++q) {
          uint32_t* dst = bp + q * kp_pad * kNR;
          pack_b_panel(tb, b, ldb, pc, kc, jc + q * kNR, nc - q * kNR, dst);
          std::memset(dst + kp_n * kNR, 0, size_t((kp_pad - kp_n) * kNR) * 4);
        }
#pragma omp for schedule(static)
        for (int64_t ic = 0; ic < m; ic += mc_max) {
          const int64_t mc = std::min(mc_max, m - ic);
          pack_a_rows(ta, a, lda, ic, mc, pc, kc, kp_pad, a_pack.data());
          for (int64_t q = 0; q < panels; ++q)
            for (int64_t ir = 0; ir < mc; ir += kAmxM)
              amx_kernel(kp_pad, a_pack.data() + ir * kp_pad, bp + q * kp_pad * kNR,
                         c + (ic + ir) * ldc + jc + q * kNR, ldc, std::min(kAmxM, mc - ir),
                         std::min(kNR, nc - q * kNR), alpha, beta, pc == 0);
        }
      }
    }
    amx_release();
  }
}

// Whether this CPU has AMX's tiles and bf16 products (CPUID leaf 7: EDX bits 24 and 22) and Linux
// lets this process use them: the tiles' 8 KB of state is handed out on request only
// (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, once per process).
bool amx_usable() {
  static const bool yes = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if (!(edx & (1u << 24)) || !(edx & (1u << 22))) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return yes;
}

std::atomic<int> g_engine{-1};  // Bf16Engine, or -1: not chosen yet (the fastest there is)

}  // namespace

bool has_amx_bf16() { return amx_usable(); }

void set_bf16_gemm_engine(Bf16Engine e) {
  FSDP_CHECK(e != Bf16Engine::amx || amx_usable(),
             "[gemm_bf16] AMX asked for, but this CPU (or its kernel) gives no AMX tiles");
  g_engine.store(int(e));
}

Bf16Engine bf16_gemm_engine() {
  int e = g_engine.load();
  if (e < 0) {
    e = int(amx_usable() ? Bf16Engine::amx : Bf16Engine::avx512);
    g_engine.store(e);
  }
  return Bf16Engine(e);
}

bool has_bf16_gemm() {
  static const bool yes = __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512f");
  return yes;
}

void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // C = beta * C (beta 0 writes zeros, whatever C held)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  if (bf16_gemm_engine() == Bf16Engine::amx)
    return gemm_bf16_amx(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  // Rows per A block: every thread gets one where m is small.
  const int64_t per_thread = (m + threads - 1) / threads;
  const int64_t mc_max = std::min(kMC, (per_thread + kMR - 1) / kMR * kMR);
  const int64_t nc_max = std::min(kNC, (n + kNR - 1) / kNR * kNR);
  thread_local std::vector<uint32_t> b_pack;
  b_pack.resize(size_t(nc_max / 2 * kKC + kNR));
  uint32_t* bp = b_pack.data();
#pragma omp parallel num_threads(threads)
  {
    thread_local std::vector<uint32_t> a_pack;
    a_pack.resize(size_t(mc_max / 2 * kKC + kMR));
    for (int64_t jc = 0; jc < n; jc += kNC) {
      const int64_t nc = std::min(kNC, n - jc), panels = (nc + kNR - 1) / kNR;
      for (int64_t pc = 0; pc < k; pc += kKC) {
        const int64_t kc = std::min(kKC, k - pc), kp_n = (kc + 1) / 2;
#pragma omp for schedule(static)
        for (int64_t q = 0; q < panels; ++q)
          pack_b_panel(tb, b, ldb, pc, kc, jc + q * kNR, nc - q * kNR, bp + q * kp_n * kNR);
#pragma omp for schedule(static)
        for (int64_t ic = 0; ic < m; ic += mc_max) {
          const int64_t mc = std::min(mc_max, m - ic);
          pack_a(ta, a, lda, ic, mc, pc, kc, a_pack.data());
          for (int64_t q = 0; q < panels; ++q)
            for (int64_t ir = 0; ir < mc; ir += kMR)
              micro_kernel(kp_n, a_pack.data() + (ir / kMR) * kp_n * kMR, bp + q * kp_n * kNR,
                           c + (ic + ir) * ldc + jc + q * kNR, ldc, std::min(kMR, mc - ir),
                           std::min(kNR, nc - q * kNR), alpha, beta, pc == 0);
        }
      }
    }
  }
}

#else  // no AVX512_BF16 outside x86-64: bf16 GEMMs compute in f32 on widened copies

bool has_bf16_gemm() { return false; }
bool has_amx_bf16() { return false; }
void set_bf16_gemm_engine(Bf16Engine e) {
  FSDP_CHECK(e != Bf16Engine::amx, "[gemm_bf16] AMX asked for, but this CPU has none");
}
Bf16Engine bf16_gemm_engine() { return Bf16Engine::avx512; }

void gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
               const uint16_t*, int64_t, float, float*, int64_t) {
  FSDP_FAIL("[gemm_bf16] this CPU has no AVX512_BF16 (has_bf16_gemm() is false)");
}

#endif

}  // namespace fsdp::kernels::cpu
