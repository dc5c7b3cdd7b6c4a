// Token sources (fsdp/data/token_sources.h): the shuffle, the stream every source batches
// through, tokens in memory, a file read as bytes, random tokens, and open_token_stream, which
// picks between bytes and llm.c's shards (bin_shards.cpp) by what the spec names.
#include "fsdp/data/token_sources.h"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <type_traits>

#include "fsdp/core/error.h"
#include "fsdp/nn/init.h"
#include "src/data/data_files.h"

namespace fsdp::data {

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

int64_t shuffle_window(int64_t index, int64_t windows, uint64_t seed, int64_t epoch) {
  FSDP_CHECK(windows > 0 && index >= 0 && index < windows,
             "[data] shuffle_window: index {} is not in [0, {})", index, windows);
  if (windows == 1) return 0;
  // An even number of bits covering [0, windows): halves of `half` bits each.
  int bits = std::bit_width(uint64_t(windows - 1));
  bits += bits & 1;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t(1) << half) - 1;
  const uint64_t key = mix64(seed ^ mix64(uint64_t(epoch) * 0xd1b54a32d192ed03ull + 1));
  uint64_t x = uint64_t(index);
  do {  // cycle-walking: a bijection on [0, 2^bits) restricted to [0, windows) stays one
    uint64_t l = x >> half, r = x & mask;
    for (uint64_t round = 0; round < 6; ++round) {
      const uint64_t f = mix64(key ^ (r * 0x9e3779b97f4a7c15ull) ^ (round << 58)) & mask;
      const uint64_t next = l ^ f;
      l = r;
      r = next;
    }
    x = (l << half) | r;
  } while (x >= uint64_t(windows));
  return int64_t(x);
}

TokenStream::TokenStream(int64_t size, std::string description, int64_t seq)
    : size_(size), description_(std::move(description)) {
  FSDP_CHECK(size_ >= seq + 1, "[data] {} has {} tokens; need at least seq + 1 = {}", description_,
             size_, seq + 1);
}

std::vector<int32_t> TokenStream::read(int64_t begin, int64_t count) const {
  FSDP_CHECK(begin >= 0 && count >= 0, "[data] read({}, {}) of {}", begin, count, description_);
  std::vector<int32_t> out(static_cast<size_t>(count));
  int64_t pos = begin % size_, done = 0;
  while (done < count) {  // wrapping at the end, as many times as it takes
    const int64_t k = std::min(count - done, size_ - pos);
    copy(pos, k, out.data() + done);
    done += k;
    pos = 0;
  }
  return out;
}

Batch TokenStream::windows(int64_t first, int64_t rows, int64_t seq) const {
  FSDP_CHECK(first >= 0 && rows >= 0 && seq > 0, "[data] windows({}, {}, seq {}) of {}", first,
             rows, seq, description_);
  Batch b{Tensor::empty({rows, seq}, DType::i32), Tensor::empty({rows, seq}, DType::i32), Tensor()};
  int32_t* in = b.inputs.data<int32_t>();
  int32_t* tg = b.targets.data<int32_t>();
  const int64_t windows = std::max<int64_t>(1, (size_ - 1) / seq);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t q = first + r;  // global window index
    int64_t start = (q * seq) % size_;
    if (shuffle_) start = shuffle_window(q % windows, windows, seed_, q / windows) * seq;
    const std::vector<int32_t> row = read(start, seq + 1);
    std::copy(row.begin(), row.end() - 1, in + r * seq);
    std::copy(row.begin() + 1, row.end(), tg + r * seq);
  }
  return b;
}

void TokenStream::set_shuffle(uint64_t seed, int64_t seq) {
  FSDP_CHECK(seq > 0, "[data] shuffle needs seq > 0, got {}", seq);
  shuffle_ = true;
  seed_ = seed;
}

std::pair<std::unique_ptr<TokenStream>, std::unique_ptr<TokenStream>> TokenStream::split_tail(
    double fraction, int64_t seq) const {
  FSDP_CHECK(fraction > 0 && fraction < 1, "[data] validation fraction must be in (0, 1), got {}",
             fraction);
  const int64_t cut = int64_t(double(size_) * (1.0 - fraction));
  auto t =
      slice(0, cut, fmt::format("{} [first {:.0f}%]", description_, 100 * (1 - fraction)), seq);
  auto v = slice(cut, size_, fmt::format("{} [last {:.0f}%]", description_, 100 * fraction), seq);
  return {std::move(t), std::move(v)};
}

TokenVector::TokenVector(std::vector<int32_t> tokens, std::string description, int64_t seq)
    : TokenStream(int64_t(tokens.size()), std::move(description), seq),
      tokens_(std::move(tokens)) {}

void TokenVector::copy(int64_t begin, int64_t count, int32_t* out) const {
  std::copy_n(tokens_.begin() + begin, count, out);
}

std::unique_ptr<TokenStream> TokenVector::slice(int64_t begin, int64_t end, std::string description,
                                                int64_t seq) const {
  return std::make_unique<TokenVector>(
      std::vector<int32_t>(tokens_.begin() + begin, tokens_.begin() + end), std::move(description),
      seq);
}

namespace {

std::vector<int32_t> read_bytes(const std::string& path, int64_t vocab) {
  FSDP_CHECK(vocab >= 256, "[data] a byte-level text file needs vocab >= 256, got {}", vocab);
  std::error_code ec;
  FSDP_CHECK(std::filesystem::exists(path, ec), "[data] data file '{}' does not exist", path);
  FSDP_CHECK(!std::filesystem::is_directory(path, ec),
             "[data] data file '{}' is a directory, expected a file", path);
  check_regular_file(path);
  std::ifstream f(path, std::ios::binary);
  FSDP_CHECK(f.good(), "[data] cannot read data file '{}': {}", path, std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  FSDP_CHECK(!f.bad(), "[data] reading '{}' failed: {}", path, std::strerror(errno));
  std::vector<int32_t> tokens(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i)
    tokens[i] = int32_t(static_cast<unsigned char>(bytes[i]));
  return tokens;
}

}  // namespace

ByteTextSource::ByteTextSource(const std::string& path, int64_t vocab, int64_t seq)
    : TokenVector(read_bytes(path, vocab), path, seq) {
  description_ = fmt::format("{} ({} bytes)", path, tokens_.size());
}

Batch RandomTokenSource::windows(int64_t first, int64_t rows, int64_t seq) const {
  Batch b{Tensor::empty({rows, seq}, DType::i32), Tensor::empty({rows, seq}, DType::i32), Tensor()};
  int32_t* in = b.inputs.data<int32_t>();
  int32_t* tg = b.targets.data<int32_t>();
  const uint64_t key = nn::name_hash("random-tokens") ^ (seed_ * 0x9e3779b97f4a7c15ull);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < seq; ++t) {
      const uint64_t idx = uint64_t(((first + r) * seq + t) * 2);
      in[r * seq + t] = int32_t(nn::counter_uniform(key, idx) * double(vocab_));
      tg[r * seq + t] = int32_t(nn::counter_uniform(key, idx + 1) * double(vocab_));
    }
  return b;
}

std::string RandomTokenSource::describe() const {
  return fmt::format("random tokens in [0, {})", vocab_);
}


std::unique_ptr<TokenStream> open_token_stream(const std::string& spec, int64_t vocab,
                                               int64_t seq) {
  const bool shards = names_shards(spec);
  // A .bin file is an llm.c shard by its name: one with a bad magic is refused (BinShardSource
  // names it), never read as bytes.
  if (shards) return std::make_unique<BinShardSource>(spec, vocab, seq);
  return std::make_unique<ByteTextSource>(spec, vocab, seq);
}

}  // namespace fsdp::data
