// Counter-based initialisation: element i of parameter `name` under `seed`
// is a pure function of the three. Normals use Box-Muller on the counters
// (2i, 2i + 1), so an element never depends on its neighbours.
#include "fsdp/nn/init.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace fsdp::nn {

namespace {
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t name_hash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

double counter_uniform(uint64_t key, uint64_t counter) {
  uint64_t r = splitmix64(key ^ splitmix64(counter));
  return (double(r >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0, 1), never 0
}

void init_fill(const Init& init, uint64_t seed, std::string_view name, int64_t begin,
               const Tensor& out) {
  FSDP_CHECK(out.is_contiguous(), "[init] parameter '{}' buffer must be contiguous", name);
  // The values are made in f64 a piece at a time (at most 8 MB, reused from the allocator's
  // cache), never as one f64 copy of the whole buffer beside it.
  constexpr int64_t kPiece = int64_t(1) << 20;
  const int64_t n = out.numel();
  if (out.device().is_meta()) {  // shapes only: nothing to fill; the piece as the CPU makes it
    if (n > 0) Tensor::empty({std::min(n, kPiece)}, DType::f64, out.device());
    return;
  }
  const uint64_t key = splitmix64(seed) ^ name_hash(name);
  const Tensor flat = out.view({n});
  const Tensor tmp = Tensor::empty({std::min(n, kPiece)}, DType::f64);
  double* p = tmp.data<double>();
  for (int64_t at = 0; at < n; at += kPiece) {
    const int64_t m = std::min(kPiece, n - at);
#pragma omp parallel for if (m > (1 << 16))
    for (int64_t j = 0; j < m; ++j) {
      const uint64_t i = uint64_t(begin + at + j);
      switch (init.kind) {
        case Init::Kind::constant:
          p[j] = init.a;
          break;
        case Init::Kind::uniform:
          p[j] = init.a + (init.b - init.a) * counter_uniform(key, i);
          break;
        case Init::Kind::normal: {
          double u1 = counter_uniform(key, 2 * i), u2 = counter_uniform(key, 2 * i + 1);
          p[j] = init.a +
                 init.b * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
          break;
        }
      }
    }
    flat.narrow(0, at, m).copy_(tmp.narrow(0, 0, m));
  }
}

}  // namespace fsdp::nn
