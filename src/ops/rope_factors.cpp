// Llama 3's rope scaling in llama.cpp's form: the per-frequency factors of rope_freqs.weight, both
// ways (fsdp/ops/rope.h).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/ops/rope.h"

namespace fsdp::ops {

std::vector<float> llama3_rope_factors(const Rope& rope, int64_t head_dim) {
  const std::vector<double> plain = rope_frequencies(Rope(rope.theta), head_dim),
                            scaled = rope_frequencies(rope, head_dim);
  std::vector<float> factors(plain.size());
  for (size_t i = 0; i < plain.size(); ++i) factors[i] = float(plain[i] / scaled[i]);
  return factors;
}

RopeScaling llama3_scaling_of_factors(const std::vector<double>& factors, double theta,
                                      const std::string& where) {
  FSDP_CHECK(!factors.empty(), "[gguf] {}: no frequency factors", where);
  const int64_t hd = 2 * int64_t(factors.size());
  const double top = *std::max_element(factors.begin(), factors.end());
  auto gives_them = [&](const RopeScaling& s) {
    if (s.enabled()) {
      try {
        check_rope_scaling(s, where);
      } catch (const Error&) {
        return false;
      }
    }
    const std::vector<float> want = llama3_rope_factors(Rope(theta, s), hd);
    for (size_t i = 0; i < factors.size(); ++i)
      if (!(std::abs(factors[i] - double(want[i])) <= 1e-5 * std::abs(double(want[i]))))
        return false;
    return true;
  };
  if (gives_them({})) return {};  // all ones: no scaling
  // Llama 3.1's (and 3.2's) constants, with the file's factor.
  if (const RopeScaling llama31{.factor = top}; gives_them(llama31)) return llama31;
  // Otherwise the blended frequencies tell the ratios: 1/f_i = (1 - s)/F + s/1 gives each one's s,
  // which is original / wavelength_i - low over high - low, affine in 1 / wavelength_i; with low 1
  // its slope and intercept give high and original. The first and last blended ones fit it.
  std::vector<std::pair<double, double>> blended;  // (1 / wavelength, s)
  const std::vector<double> plain = rope_frequencies(Rope(theta), hd);
  for (size_t i = 0; i < factors.size(); ++i)
    if (factors[i] > 1.0 + 1e-5 && factors[i] < top * (1.0 - 1e-5))
      blended.emplace_back(plain[i] / (2.0 * std::numbers::pi),
                           (1.0 / factors[i] - 1.0 / top) / (1.0 - 1.0 / top));
  if (blended.size() >= 2 && blended.front().first != blended.back().first) {
    const auto [x0, s0] = blended.front();
    const auto [x1, s1] = blended.back();
    const double slope = (s1 - s0) / (x1 - x0), intercept = s0 - slope * x0;
    if (intercept < 0) {
      const double high = 1.0 - 1.0 / intercept, original = -slope / intercept;
      RopeScaling fit{.factor = top, .low_freq_factor = 1.0};
      // Round to what a config would say (an integer context, a high factor of a few digits)
      // when that still gives the factors.
      fit.high_freq_factor = std::round(high * 1e4) / 1e4;
      fit.original_context = std::round(original);
      if (gives_them(fit)) return fit;
      fit.high_freq_factor = high, fit.original_context = original;
      if (gives_them(fit)) return fit;
    }
  }
  FSDP_FAIL(
      "[gguf] {}: the frequency factors ({} of them, {} .. {}) are not Llama 3's rope "
      "scaling: no factor, low and high frequency factors and original context give them",
      where, factors.size(), factors.front(), factors.back());
}

}  // namespace fsdp::ops
