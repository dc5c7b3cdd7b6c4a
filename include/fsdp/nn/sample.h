// Sampling from a Transformer: temperature over the top-k likeliest ids and the
// smallest set of them whose probability reaches top_p (greedy at temperature
// 0), drawn with the counter-based generator, so a seed gives the same text at
// any world size. The llama architecture decodes with a KV cache: the context
// once (prefill), then one position per new id; when the cache is full (seq
// positions) it keeps the last seq/2 ids and fills again. The seed
// architecture attends both ways, so each new id recomputes the last `seq`
// ids. fsdp-train's end-of-training sample and fsdp-generate both use it. On a
// sharded model every rank must call it in lockstep: its forwards are
// collective.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/nn/transformer.h"

namespace fsdp::nn {

struct SampleOptions {
  int64_t tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 0;         // 0: all candidates
  double top_p = 1.0;        // nucleus: the likeliest ids up to this much probability
  int64_t max_id = 0;        // sample among ids below this (the tokenizer's size); 0: the vocab
  uint64_t seed = 0;
  Device device = Device::cpu();   // where the model's parameters are
  bool kv_cache = true;            // llama only; false: recompute the window for every id
  std::optional<int32_t> stop_id;  // end of text: stop after sampling it
  // Called with each id as it is sampled (streaming output); may be empty.
  std::function<void(int32_t)> on_token;
};

struct SampleStats {
  int64_t prompt_tokens = 0, new_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

// Returns the ids that follow `context` (an empty context starts from a space): `tokens` of
// them, fewer when stop_id comes up.
std::vector<int32_t> sample(Transformer& model, std::vector<int32_t> context,
                            const SampleOptions& o, SampleStats* stats = nullptr);

}  // namespace fsdp::nn
