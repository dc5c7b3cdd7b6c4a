// Parameter initialisation that depends only on (seed, parameter name,
// element index), never on how the parameter is split. A rank that holds
// elements [begin, begin + n) of "layers.3.ffn.0.weight" fills exactly the
// values a single process would put there: this is what lets fully_shard
// create parameters directly as shards and still give the same model at
// every world size. The generator is counter-based (splitmix64 of a key).
#pragma once

#include <cstdint>
#include <string_view>

#include "fsdp/core/tensor.h"

namespace fsdp::nn {

struct Init {
  enum class Kind : uint8_t { normal, uniform, constant };
  Kind kind = Kind::constant;
  double a = 0, b = 0;  // normal: mean, std; uniform: low, high; constant: value

  static Init normal(double mean, double std) { return {Kind::normal, mean, std}; }
  static Init uniform(double low, double high) { return {Kind::uniform, low, high}; }
  static Init constant(double v) { return {Kind::constant, v, 0}; }
};

uint64_t name_hash(std::string_view name);
// A uniform double in (0, 1) for (key, counter).
double counter_uniform(uint64_t key, uint64_t counter);

// Fills `out` (contiguous, any floating dtype) with elements
// [begin, begin + out.numel()) of the parameter `name`.
void init_fill(const Init& init, uint64_t seed, std::string_view name, int64_t begin,
               const Tensor& out);

}  // namespace fsdp::nn
