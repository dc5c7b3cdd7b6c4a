// Every environment knob of fsdp.cpp is declared once, in env.cpp, with its
// default and a one-line meaning (NCCL's NCCL_PARAM). Reading an undeclared
// knob is a bug and throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp {

struct EnvKnob {
  const char* name;
  const char* default_value;
  const char* meaning;
};

const std::vector<EnvKnob>& env_knobs();
// The knob's value from the environment, or its declared default.
std::string env_str(const char* name);
double env_double(const char* name);

}  // namespace fsdp
