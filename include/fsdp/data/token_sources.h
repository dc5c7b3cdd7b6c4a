// Token sources for training, and the batch layout that every world size
// shares. The data is one sequence of windows: window q is the T + 1 tokens
// that start at token q*T, wrapping at the end of the data, as llm.c reads its
// shards (inputs are the first T, targets the last T). With a global batch of
// G rows, row g of step s is window s*G + g. A rank asks for its own range of
// rows, so the data a step sees never depends on how many ranks share it, and
// the windows read so far (not the batches) say where a run is: a resume at
// another batch size or world size continues at the next unread window.
//
// Key decision: llm.c's shards are never loaded. A rank preads only the T + 1
// tokens of each of its rows (no mapping, so a shard truncated under a run is a
// named error, not a SIGBUS), so its resident memory does not grow with the
// corpus: a 10-billion-token FineWeb sample costs what a small
// file does. The shuffle is a keyed bijection on the window index (a Feistel
// network, shuffle_window()), so it needs no permutation of the whole corpus.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/tensor.h"

namespace fsdp::data {

struct Batch {
  Tensor inputs, targets;  // [rows, T] i32; a target of kIgnoreIndex is not trained on
  // Packed rows (PackedSource): [rows, T] i32, the position where each token's document begins
  // (fsdp/ops/ops.h); undefined: one document per row.
  Tensor doc_start;
  // Each row's reference log-prob, from a source that holds them (PreferenceSource::set_reference:
  // precomputed before training, train/preference.h), on the host; empty: none.
  std::vector<double> reference_logps = {};
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Windows [first, first + rows) of the sequence, one per row.
  virtual Batch windows(int64_t first, int64_t rows, int64_t seq) const = 0;
  // Rows [row_begin, row_begin + rows) of the global batch of `global_rows` at `step`.
  Batch batch(int64_t step, int64_t global_rows, int64_t row_begin, int64_t rows,
              int64_t seq) const {
    return windows(step * global_rows + row_begin, rows, seq);
  }
  virtual std::string describe() const = 0;
  // Whether some targets may be kIgnoreIndex (fsdp/core/ignore_index.h: a loss mask, as chat
  // data has on every turn but the assistant's). A trainer then averages the loss over the
  // targets it counts (DataLoader::count_targets), not over every position.
  virtual bool masks_targets() const { return false; }
};

// Window `index` of `windows` in the shuffled order of `epoch`: a bijection on [0, windows)
// keyed by (seed, epoch), a 6-round Feistel network on the next even power of two with
// cycle-walking (fewer than 4 rounds of walking on average). O(1) time and memory.
int64_t shuffle_window(int64_t index, int64_t windows, uint64_t seed, int64_t epoch);

// A stream of tokens (in memory or in mapped shards), batched as above.
class TokenStream : public TokenSource {
 public:
  Batch windows(int64_t first, int64_t rows, int64_t seq) const final;
  std::string describe() const override { return description_; }
  int64_t size() const { return size_; }  // tokens
  // `count` tokens from `begin`, wrapping at size(), as a batch row reads them.
  std::vector<int32_t> read(int64_t begin, int64_t count) const;
  // Shuffled order: the stream is cut into windows(seq) = max(1, (size() - 1) / seq) windows
  // of seq + 1 tokens (window w starts at token w*seq) and global row q reads window
  // shuffle_window(q % windows, windows, seed, q / windows): each epoch visits every window
  // once, in an order drawn from (seed, epoch), the same on every rank, so ranks still read
  // disjoint rows. Off: file order (llm.c's). Either way a resume continues the same order
  // from the number of windows read.
  void set_shuffle(uint64_t seed, int64_t seq);
  // Splits off the last `fraction` of the tokens as a validation stream (both unshuffled;
  // mapped shards are shared, not copied).
  std::pair<std::unique_ptr<TokenStream>, std::unique_ptr<TokenStream>> split_tail(
      double fraction, int64_t seq) const;

 protected:
  TokenStream(int64_t size, std::string description, int64_t seq);
  // Tokens [begin, begin + count) into out; begin + count <= size(). Throws for an id that the
  // stream's vocab cannot hold.
  virtual void copy(int64_t begin, int64_t count, int32_t* out) const = 0;
  // Tokens [begin, end) as a stream of their own.
  virtual std::unique_ptr<TokenStream> slice(int64_t begin, int64_t end, std::string description,
                                             int64_t seq) const = 0;
  int64_t size_;
  std::string description_;
  bool shuffle_ = false;
  uint64_t seed_ = 0;
};

// Tokens held in memory.
class TokenVector : public TokenStream {
 public:
  TokenVector(std::vector<int32_t> tokens, std::string description, int64_t seq);
  const std::vector<int32_t>& tokens() const { return tokens_; }

 protected:
  void copy(int64_t begin, int64_t count, int32_t* out) const override;
  std::unique_ptr<TokenStream> slice(int64_t begin, int64_t end, std::string description,
                                     int64_t seq) const override;
  std::vector<int32_t> tokens_;
};

// A file read as bytes: token = byte value, so the vocab must be >= 256.
class ByteTextSource : public TokenVector {
 public:
  ByteTextSource(const std::string& path, int64_t vocab, int64_t seq);
};

// llm.c's token shards, read with pread: a header of 256 int32 (magic, version, token
// count), then the tokens, little-endian:
//   magic 20240520, version 1: uint16 tokens (llm.c's GPT-2 shards, ids < 65536);
//   magic 20240801, version 7: uint32 tokens (llm.c's Llama 3 shards, any vocab).
// `spec` is one file, a directory (its *.bin files in name order) or a glob; the shards are
// read in that order as one stream, and may mix the two widths. Headers are checked at open
// (magic, version, count against the file size); each token is checked against `vocab` when a
// batch reads it, naming the shard and the position.
class BinShardSource : public TokenStream {
 public:
  BinShardSource(const std::string& spec, int64_t vocab, int64_t seq);
  struct Shards;  // the mappings, shared by slices

 protected:
  void copy(int64_t begin, int64_t count, int32_t* out) const override;
  std::unique_ptr<TokenStream> slice(int64_t begin, int64_t end, std::string description,
                                     int64_t seq) const override;

 private:
  BinShardSource(std::shared_ptr<const Shards> shards, int64_t offset, int64_t size,
                 std::string description, int64_t seq);
  std::shared_ptr<const Shards> shards_;
  int64_t offset_ = 0;  // of this stream's first token in the shards
};

// Opens `spec` as llm.c shards (a directory, a glob, a .bin file or a file that starts with a
// shard magic) or else as bytes.
std::unique_ptr<TokenStream> open_token_stream(const std::string& spec, int64_t vocab, int64_t seq);

// What the data at `spec` is, by content rather than by path: the files open_token_stream would
// read (in its order), their total size, and a 64-bit hash of each file's size and every byte
// (full, the default: the whole corpus read once, at memory speed), or, for checkpoints saved
// before the full hash, of its first 4 KiB and 4 KiB samples at 16 fixed fractions of it (a change
// that misses every sample and keeps every size is not seen). The same path with new contents
// gets another identity; a byte-identical copy at another path gets the same one.
struct DataIdentity {
  int64_t files = 0, bytes = 0;
  uint64_t hash = 0;
  bool full = true;
  std::string str() const;  // "35149 bytes in 1 file(s), content hash 0123456789abcdef"
};
DataIdentity data_identity(const std::string& spec, bool full = true);

// Writes tokens as one llm.c shard: uint16 (magic 20240520, version 1), or uint32 (magic
// 20240801, version 7). Used by tests; scripts/prepare_text.py writes the same.
void write_bin_shard(const std::string& path, const std::vector<uint16_t>& tokens);
void write_bin_shard_u32(const std::string& path, const std::vector<uint32_t>& tokens);

// Uniform random inputs and targets in [0, vocab), as the reference script
// draws them. Token (window, position) depends only on the seed.
class RandomTokenSource : public TokenSource {
 public:
  RandomTokenSource(int64_t vocab, uint64_t seed) : vocab_(vocab), seed_(seed) {}
  Batch windows(int64_t first, int64_t rows, int64_t seq) const override;
  std::string describe() const override;

 private:
  int64_t vocab_;
  uint64_t seed_;
};

}  // namespace fsdp::data
