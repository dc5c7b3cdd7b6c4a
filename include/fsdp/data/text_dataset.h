// Token sources for training, and the batch layout that every world size
// shares. With a global batch of G rows of T tokens, row g of step s is the
// T + 1 tokens that start at token (s*G + g)*T, wrapping at the end of the
// data, as llm.c reads its shards: inputs are the first T, targets the last
// T. A rank asks for its own range of rows, so the data a step sees never
// depends on how many ranks share it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/core/tensor.h"

namespace fsdp::data {

struct Batch {
  Tensor inputs, targets;  // [rows, T] i32
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Rows [row_begin, row_begin + rows) of the global batch of `global_rows` at `step`.
  virtual Batch batch(int64_t step, int64_t global_rows, int64_t row_begin, int64_t rows, int64_t seq) const = 0;
  virtual std::string describe() const = 0;
};

// A file read as bytes: token = byte value, so the vocab must be >= 256.
class ByteTextSource : public TokenSource {
 public:
  ByteTextSource(const std::string& path, int64_t vocab, int64_t seq);
  Batch batch(int64_t step, int64_t global_rows, int64_t row_begin, int64_t rows, int64_t seq) const override;
  std::string describe() const override;
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  std::string path_;
  std::vector<int32_t> tokens_;
};

// Uniform random inputs and targets in [0, vocab), as the reference script
// draws them. Token (step, row, position) depends only on the seed.
class RandomTokenSource : public TokenSource {
 public:
  RandomTokenSource(int64_t vocab, uint64_t seed) : vocab_(vocab), seed_(seed) {}
  Batch batch(int64_t step, int64_t global_rows, int64_t row_begin, int64_t rows, int64_t seq) const override;
  std::string describe() const override;

 private:
  int64_t vocab_;
  uint64_t seed_;
};

}  // namespace fsdp::data
