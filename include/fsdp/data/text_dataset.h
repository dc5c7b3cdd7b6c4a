// Token sources for training, and the batch layout that every world size
// shares. With a global batch of G rows of T tokens, row g of step s is the
// T + 1 tokens that start at token (s*G + g)*T, wrapping at the end of the
// data, as llm.c reads its shards: inputs are the first T, targets the last
// T. A rank asks for its own range of rows, so the data a step sees never
// depends on how many ranks share it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
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
  virtual Batch batch(int64_t step, int64_t global_rows, int64_t row_begin, int64_t rows,
                      int64_t seq) const = 0;
  virtual std::string describe() const = 0;
};

// A stream of tokens held in memory, batched as above.
class TokenStream : public TokenSource {
 public:
  TokenStream(std::vector<int32_t> tokens, std::string description, int64_t seq);
  Batch batch(int64_t step, int64_t global_rows, int64_t row_begin, int64_t rows,
              int64_t seq) const override;
  std::string describe() const override { return description_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // Shuffled order: the stream is cut into windows of seq + 1 tokens and each
  // epoch visits them in a permutation drawn from (seed, epoch), the same on
  // every rank, so ranks still read disjoint rows. Off: file order (llm.c's).
  void set_shuffle(uint64_t seed, int64_t seq);
  // Splits off the last `fraction` of the tokens as a validation stream.
  std::pair<std::unique_ptr<TokenStream>, std::unique_ptr<TokenStream>> split_tail(
      double fraction, int64_t seq) const;

 protected:
  std::vector<int32_t> tokens_;
  std::string description_;
  bool shuffle_ = false;
  uint64_t seed_ = 0;
  mutable int64_t perm_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

// A file read as bytes: token = byte value, so the vocab must be >= 256.
class ByteTextSource : public TokenStream {
 public:
  ByteTextSource(const std::string& path, int64_t vocab, int64_t seq);
};

// llm.c's token shards: a header of 256 int32 (magic 20240520, version 1, the
// token count), then uint16 tokens. `spec` is one file, a directory (its
// *.bin files in name order) or a glob; the shards are read in that order.
// Every token must be below `vocab`.
class BinShardSource : public TokenStream {
 public:
  BinShardSource(const std::string& spec, int64_t vocab, int64_t seq);
};

// Opens `spec` as llm.c shards (a directory, a glob, or a file that starts
// with the shard magic) or else as bytes.
std::unique_ptr<TokenStream> open_token_stream(const std::string& spec, int64_t vocab, int64_t seq);

// Writes tokens as one llm.c shard (used by tests and scripts/prepare_text.py's C++ twin).
void write_bin_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// Uniform random inputs and targets in [0, vocab), as the reference script
// draws them. Token (step, row, position) depends only on the seed.
class RandomTokenSource : public TokenSource {
 public:
  RandomTokenSource(int64_t vocab, uint64_t seed) : vocab_(vocab), seed_(seed) {}
  Batch batch(int64_t step, int64_t global_rows, int64_t row_begin, int64_t rows,
              int64_t seq) const override;
  std::string describe() const override;

 private:
  int64_t vocab_;
  uint64_t seed_;
};

}  // namespace fsdp::data
