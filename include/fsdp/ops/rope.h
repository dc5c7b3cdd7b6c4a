// The rotary embedding's frequencies: pair i of a head of hd dims turns by position * f_i, with
// f_i = theta^(-2i / hd) (Hugging Face's default rope), or those of Llama 3's scaling. ops::rope_
// takes a Rope; a plain theta is one.
#pragma once

#include <cstdint>
#include <string>
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

}  // namespace fsdp::ops
