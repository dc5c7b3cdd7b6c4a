// Every environment knob of fsdp.cpp is declared once, in env.cpp, with its
// default and a one-line meaning (NCCL's NCCL_PARAM). Reading an undeclared
// knob is a bug and throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp {

// What a knob's value may be. text: anything; choice: one of `choices` ("a|b|c"); flag: 0 or 1;
// integer / number: a whole / finite number in [min, max]; seconds: a finite time-out,
// above 0 and at most max.
enum class EnvKind { text, choice, flag, integer, number, seconds };

struct EnvKnob {
  const char* name;
  const char* default_value;
  const char* meaning;
  EnvKind kind = EnvKind::text;
  double min = 0, max = 0;
  const char* choices = "";
};

const std::vector<EnvKnob>& env_knobs();
// The knob's value from the environment, or its declared default.
std::string env_str(const char* name);
// The knob's value as a number, checked against its kind and range (throws naming the variable).
double env_double(const char* name);
// Checks every declared knob that is set in the environment against its kind and range, naming
// the variable, the value and what it must be. fsdp-train and init_process_group call it first.
void validate_env();

// Where measured values are cached (GEMM peaks, data hashes): FSDP_CACHE_DIR, else
// $XDG_CACHE_HOME/fsdp, ~/.cache/fsdp, or the temporary folder's fsdp-cache.
std::string cache_dir();

}  // namespace fsdp
