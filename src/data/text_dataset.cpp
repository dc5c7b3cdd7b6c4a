// Byte-level text and random token sources.
#include "fsdp/data/text_dataset.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fsdp/nn/init.h"

namespace fsdp::data {

ByteTextSource::ByteTextSource(const std::string& path, int64_t vocab, int64_t seq) : path_(path) {
  FSDP_CHECK(vocab >= 256, "[data] a byte-level text file needs vocab >= 256, got {}", vocab);
  std::error_code ec;
  FSDP_CHECK(std::filesystem::exists(path, ec), "[data] data file '{}' does not exist", path);
  FSDP_CHECK(!std::filesystem::is_directory(path, ec), "[data] data file '{}' is a directory, expected a file",
             path);
  std::ifstream f(path, std::ios::binary);
  FSDP_CHECK(f.good(), "[data] cannot read data file '{}': {}", path, std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  FSDP_CHECK(!f.bad(), "[data] reading '{}' failed: {}", path, std::strerror(errno));
  FSDP_CHECK(int64_t(bytes.size()) >= seq + 1, "[data] data file '{}' has {} bytes; need at least seq + 1 = {}",
             path, bytes.size(), seq + 1);
  tokens_.resize(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) tokens_[i] = int32_t(static_cast<unsigned char>(bytes[i]));
}

Batch ByteTextSource::batch(int64_t step, int64_t global_rows, int64_t row_begin, int64_t rows,
                            int64_t seq) const {
  Batch b{Tensor::empty({rows, seq}, DType::i32), Tensor::empty({rows, seq}, DType::i32)};
  int32_t* in = b.inputs.data<int32_t>();
  int32_t* tg = b.targets.data<int32_t>();
  const int64_t n = int64_t(tokens_.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t start = ((step * global_rows + row_begin + r) * seq) % n;
    for (int64_t t = 0; t < seq; ++t) {
      in[r * seq + t] = tokens_[size_t((start + t) % n)];
      tg[r * seq + t] = tokens_[size_t((start + t + 1) % n)];
    }
  }
  return b;
}

std::string ByteTextSource::describe() const { return fmt::format("{} ({} bytes)", path_, tokens_.size()); }

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

std::string RandomTokenSource::describe() const { return fmt::format("random tokens in [0, {})", vocab_); }

}  // namespace fsdp::data
