// Sampling from a MiniLLM: temperature over the top-k likeliest ids (greedy
// at temperature 0), drawn with the counter-based generator, so a seed gives
// the same text at any world size. Each new id recomputes the last `seq` ids
// (there is no KV cache yet). fsdp-train's end-of-training sample and
// fsdp-generate both use it. On a sharded model every rank must call it in
// lockstep: its forwards are collective.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/nn/minillm.h"

namespace fsdp::nn {

struct SampleOptions {
  int64_t tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 0;         // 0: all candidates
  int64_t max_id = 0;        // sample among ids below this (256: bytes); 0: the whole vocab
  uint64_t seed = 0;
  Device device = Device::cpu();  // where the model's parameters are
};

// Returns the `tokens` ids that follow `context` (an empty context starts from a space).
std::vector<int32_t> sample(MiniLLM& model, std::vector<int32_t> context, const SampleOptions& o);

}  // namespace fsdp::nn
