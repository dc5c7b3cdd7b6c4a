// The rotary embedding's frequencies: pair i of a head of hd dims turns by position * f_i, with
// f_i = theta^(-2i / hd) (Hugging Face's default rope), or those of Llama 3's scaling. ops::rope_
// takes a Rope; a plain theta is one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::ops {

// Llama 3's rope_scaling (transformers' rope_type "llama3": Llama 3.1, 3.2, 3.3). A frequency whose
// wavelength 2 pi / f is above original_context / low_freq_factor is divided by factor, one below
// original_context / high_freq_factor is kept, and those between blend the two: with
// s = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor),
// f becomes (1 - s) f / factor + s f.
struct RopeScaling {
  double factor = 0.0;  // 0: no scaling; else >= 1
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_context = 8192.0;  // original_max_position_embeddings
  bool enabled() const { return factor != 0.0; }
  bool operator==(const RopeScaling&) const = default;
};
// This scaling's name in the formats that record it: transformers' rope_type (config.json) and
// our config JSON's rope_scaling.type, both "llama3" after the model that introduced it.
inline constexpr std::string_view kRopeScalingType = "llama3";

struct Rope {
  double theta = 10000.0;
  RopeScaling scaling;
  Rope(double theta_, RopeScaling scaling_ = {})  // NOLINT(google-explicit-constructor)
      : theta(theta_), scaling(scaling_) {}
};

// f_0 .. f_{hd/2 - 1} in double (the unscaled ones exactly std::pow(theta, -2.0 * i / hd)).
std::vector<double> rope_frequencies(const Rope& rope, int64_t hd);
// Throws, naming `where` ("[model]", "[hf] dir/config.json: rope_scaling") and the value, for
// a scaling that is not one: factor below 1, a low frequency factor not below the high one, a
// factor or context that is not positive and finite.
void check_rope_scaling(const RopeScaling& s, const std::string& where);

// llama.cpp's rope_freqs.weight for Llama 3's scaling: factor_i = f_i / scaled f_i, by which
// llama.cpp divides frequency i (1 for the kept ones, the scaling factor for the low ones).
std::vector<float> llama3_rope_factors(const Rope& rope, int64_t head_dim);
// The scaling those factors are: the low and high frequency factors and the original context are
// known only up to a common multiple (their ratios set the frequencies), so the low frequency
// factor is taken to be 1 unless Llama 3.1's (1, 4, 8192) give them. Throws, naming `where` and
// the tensor, for factors that no Llama 3 scaling gives (each is checked to 1e-5).
RopeScaling llama3_scaling_of_factors(const std::vector<double>& factors, double theta,
                                      const std::string& where);

}  // namespace fsdp::ops
