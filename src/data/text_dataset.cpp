// Byte-level text and random token sources.
#include "fsdp/data/text_dataset.h"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <type_traits>

#include "fsdp/nn/init.h"

namespace fsdp::data {

TokenStream::TokenStream(std::vector<int32_t> tokens, std::string description, int64_t seq)
    : tokens_(std::move(tokens)), description_(std::move(description)) {
  FSDP_CHECK(int64_t(tokens_.size()) >= seq + 1,
             "[data] {} has {} tokens; need at least seq + 1 = {}", description_, tokens_.size(),
             seq + 1);
}

Batch TokenStream::batch(int64_t step, int64_t global_rows, int64_t row_begin, int64_t rows,
                         int64_t seq) const {
  Batch b{Tensor::empty({rows, seq}, DType::i32), Tensor::empty({rows, seq}, DType::i32)};
  int32_t* in = b.inputs.data<int32_t>();
  int32_t* tg = b.targets.data<int32_t>();
  const int64_t n = int64_t(tokens_.size());
  const int64_t windows = std::max<int64_t>(1, (n - 1) / seq);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t q = step * global_rows + row_begin + r;  // global row index
    int64_t start = (q * seq) % n;
    if (shuffle_) {
      const int64_t epoch = q / windows;
      if (epoch != perm_epoch_) {  // the permutation of this epoch's windows, from (seed, epoch)
        perm_.resize(size_t(windows));
        std::vector<std::pair<double, int64_t>> keys(static_cast<size_t>(windows));
        for (int64_t i = 0; i < windows; ++i)
          keys[size_t(i)] = {
              nn::counter_uniform(seed_ ^ (0x9e3779b97f4a7c15ull * uint64_t(epoch + 1)),
                                  uint64_t(i)),
              i};
        std::sort(keys.begin(), keys.end());
        for (int64_t i = 0; i < windows; ++i) perm_[size_t(i)] = keys[size_t(i)].second;
        perm_epoch_ = epoch;
      }
      start = perm_[size_t(q % windows)] * seq;
    }
    for (int64_t t = 0; t < seq; ++t) {
      in[r * seq + t] = tokens_[size_t((start + t) % n)];
      tg[r * seq + t] = tokens_[size_t((start + t + 1) % n)];
    }
  }
  return b;
}

void TokenStream::set_shuffle(uint64_t seed, int64_t seq) {
  FSDP_CHECK(seq > 0, "[data] shuffle needs seq > 0");
  shuffle_ = true;
  seed_ = seed;
  perm_epoch_ = -1;
}

std::pair<std::unique_ptr<TokenStream>, std::unique_ptr<TokenStream>> TokenStream::split_tail(
    double fraction, int64_t seq) const {
  FSDP_CHECK(fraction > 0 && fraction < 1, "[data] validation fraction must be in (0, 1), got {}",
             fraction);
  const size_t cut = size_t(double(tokens_.size()) * (1.0 - fraction));
  std::vector<int32_t> train(tokens_.begin(), tokens_.begin() + long(cut)),
      val(tokens_.begin() + long(cut), tokens_.end());
  auto t = std::make_unique<TokenStream>(
      std::move(train), fmt::format("{} [first {:.0f}%]", description_, 100 * (1 - fraction)), seq);
  auto v = std::make_unique<TokenStream>(
      std::move(val), fmt::format("{} [last {:.0f}%]", description_, 100 * fraction), seq);
  return {std::move(t), std::move(v)};
}

namespace {

std::vector<int32_t> read_bytes(const std::string& path, int64_t vocab) {
  FSDP_CHECK(vocab >= 256, "[data] a byte-level text file needs vocab >= 256, got {}", vocab);
  std::error_code ec;
  FSDP_CHECK(std::filesystem::exists(path, ec), "[data] data file '{}' does not exist", path);
  FSDP_CHECK(!std::filesystem::is_directory(path, ec),
             "[data] data file '{}' is a directory, expected a file", path);
  std::ifstream f(path, std::ios::binary);
  FSDP_CHECK(f.good(), "[data] cannot read data file '{}': {}", path, std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  FSDP_CHECK(!f.bad(), "[data] reading '{}' failed: {}", path, std::strerror(errno));
  std::vector<int32_t> tokens(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i)
    tokens[i] = int32_t(static_cast<unsigned char>(bytes[i]));
  return tokens;
}

constexpr int32_t kShardMagic = 20240520;

bool has_shard_magic(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  int32_t magic = 0;
  f.read(reinterpret_cast<char*>(&magic), 4);
  return f.good() && magic == kShardMagic;
}

std::vector<std::string> shard_files(const std::string& spec) {
  std::vector<std::string> files;
  std::error_code ec;
  if (std::filesystem::is_directory(spec, ec)) {
    for (auto& e : std::filesystem::directory_iterator(spec))
      if (e.path().extension() == ".bin") files.push_back(e.path().string());
    FSDP_CHECK(!files.empty(), "[data] directory '{}' holds no .bin shards", spec);
  } else if (spec.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    if (::glob(spec.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) files.push_back(g.gl_pathv[i]);
    ::globfree(&g);
    FSDP_CHECK(!files.empty(), "[data] no file matches '{}'", spec);
  } else {
    FSDP_CHECK(std::filesystem::exists(spec, ec), "[data] data file '{}' does not exist", spec);
    files.push_back(spec);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

ByteTextSource::ByteTextSource(const std::string& path, int64_t vocab, int64_t seq)
    : TokenStream(read_bytes(path, vocab), path, seq) {
  description_ = fmt::format("{} ({} bytes)", path, tokens_.size());
}

static std::vector<int32_t> read_shards(const std::vector<std::string>& files, int64_t vocab) {
  std::vector<int32_t> tokens;
  for (const std::string& path : files) {
    std::ifstream f(path, std::ios::binary);
    FSDP_CHECK(f.good(), "[data] cannot read shard '{}': {}", path, std::strerror(errno));
    std::vector<int32_t> header(256);
    f.read(reinterpret_cast<char*>(header.data()), 256 * 4);
    FSDP_CHECK(f.gcount() == 256 * 4, "[data] shard '{}' is shorter than its 1024-byte header",
               path);
    FSDP_CHECK(header[0] == kShardMagic,
               "[data] shard '{}' has magic {}; expected {} (llm.c token shard)", path, header[0],
               kShardMagic);
    FSDP_CHECK(header[1] == 1, "[data] shard '{}' has version {}; expected 1", path, header[1]);
    const int64_t count = header[2];
    // The header's count against the file's size before anything is allocated for it.
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path, ec);
    const int64_t held = ec ? 0 : (int64_t(bytes) - 1024) / 2;
    FSDP_CHECK(count >= 0 && count <= held,
               "[data] shard '{}' promises {} tokens but holds {} (truncated?)", path, count, held);
    std::vector<uint16_t> buf(static_cast<size_t>(count));
    f.read(reinterpret_cast<char*>(buf.data()), std::streamsize(buf.size() * 2));
    FSDP_CHECK(f.gcount() == std::streamsize(buf.size() * 2),
               "[data] shard '{}' promises {} tokens but holds {} (truncated?)", path, count,
               f.gcount() / 2);
    for (size_t i = 0; i < buf.size(); ++i) {
      FSDP_CHECK(int64_t(buf[i]) < vocab,
                 "[data] shard '{}': token id {} at position {} is not below vocab {}", path,
                 buf[i], i, vocab);
      tokens.push_back(int32_t(buf[i]));
    }
  }
  return tokens;
}

BinShardSource::BinShardSource(const std::string& spec, int64_t vocab, int64_t seq)
    : TokenStream(read_shards(shard_files(spec), vocab), spec, seq) {
  description_ =
      fmt::format("{} ({} shard(s), {} tokens)", spec, shard_files(spec).size(), tokens_.size());
}

std::unique_ptr<TokenStream> open_token_stream(const std::string& spec, int64_t vocab,
                                               int64_t seq) {
  std::error_code ec;
  const bool shards =
      std::filesystem::is_directory(spec, ec) || spec.find_first_of("*?[") != std::string::npos ||
      (std::filesystem::is_regular_file(spec, ec) &&
       (has_shard_magic(spec) || std::filesystem::path(spec).extension() == ".bin"));
  // A .bin file is an llm.c shard by its name: one with a bad magic is refused (BinShardSource
  // names it), never read as bytes.
  if (shards) return std::make_unique<BinShardSource>(spec, vocab, seq);
  return std::make_unique<ByteTextSource>(spec, vocab, seq);
}

void write_bin_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = kShardMagic;
  header[1] = 1;
  header[2] = int32_t(tokens.size());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(header.data()), 256 * 4);
  f.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
  FSDP_CHECK(f.good(), "[data] writing shard '{}' failed", path);
}

Batch RandomTokenSource::batch(int64_t step, int64_t global_rows, int64_t row_begin, int64_t rows,
                               int64_t seq) const {
  Batch b{Tensor::empty({rows, seq}, DType::i32), Tensor::empty({rows, seq}, DType::i32)};
  int32_t* in = b.inputs.data<int32_t>();
  int32_t* tg = b.targets.data<int32_t>();
  const uint64_t key = nn::name_hash("random-tokens") ^ (seed_ * 0x9e3779b97f4a7c15ull);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < seq; ++t) {
      const uint64_t idx = uint64_t(((step * global_rows + row_begin + r) * seq + t) * 2);
      in[r * seq + t] = int32_t(nn::counter_uniform(key, idx) * double(vocab_));
      tg[r * seq + t] = int32_t(nn::counter_uniform(key, idx + 1) * double(vocab_));
    }
  return b;
}

std::string RandomTokenSource::describe() const {
  return fmt::format("random tokens in [0, {})", vocab_);
}

}  // namespace fsdp::data
