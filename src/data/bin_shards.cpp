// llm.c's token shards as a token source (BinShardSource, fsdp/data/token_sources.h), and the
// shard writer. Key decision: a shard is read with pread(2), not mapped: a batch row opens the
// shard, preads its T + 1 tokens (the page cache serves them; a row is a few KB, so the read
// costs microseconds against a step's milliseconds), checks each against the vocab and closes
// it. A rank's resident memory is its rows, whatever the corpus' size, no descriptor is held per
// shard, and a shard truncated or replaced during training is a short read named by file and
// offset, where a mapping would have died of SIGBUS. The bytes are the same, so the losses are.
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/data/token_sources.h"
#include "src/data/data_files.h"

namespace fsdp::data {

// The mapped shards: each one's tokens, their width, and where they start in the stream.
struct BinShardSource::Shards {
  struct Shard {
    std::string path;
    int64_t count = 0, first = 0;  // tokens, and the stream position of the first
    int width = 2;                 // bytes per token
  };
  std::vector<Shard> shards;  // the non-empty ones, in stream order
  int64_t files = 0, total = 0, vocab = 0, bits16 = 0, bits32 = 0;
  Shards() = default;
  Shards(const Shards&) = delete;
  Shards& operator=(const Shards&) = delete;
  ~Shards() = default;
};

namespace {

// Opens and checks one shard's header against its size; count 0 leaves it out.
void map_shard(const std::string& path, BinShardSource::Shards& set) {
  const int fd = open_regular(path, "[data] shard");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  FSDP_CHECK(::fstat(fd, &st) == 0, "[data] cannot stat shard '{}': {}", path,
             std::strerror(errno));
  int32_t header[256] = {};
  const ssize_t got = ::pread(fd, header, kHeaderBytes, 0);
  FSDP_CHECK(got == kHeaderBytes, "[data] shard '{}' is shorter than its 1024-byte header", path);
  FSDP_CHECK(header[0] == kShardMagic || header[0] == kShardMagic32,
             "[data] shard '{}' has magic {}; expected {} (llm.c token shard, uint16) or {} "
             "(llm.c Llama 3 shard, uint32)",
             path, header[0], kShardMagic, kShardMagic32);
  const int want_version = header[0] == kShardMagic ? 1 : 7;
  FSDP_CHECK(header[1] == want_version,
             "[data] shard '{}' has version {}; expected {} for magic {} ({} tokens)", path,
             header[1], want_version, header[0], want_version == 1 ? "uint16" : "uint32");
  const int width = header[0] == kShardMagic ? 2 : 4;
  const int64_t count = header[2];
  // The header's count against the file's size before anything is mapped for it.
  const int64_t held = (int64_t(st.st_size) - kHeaderBytes) / width;
  FSDP_CHECK(count >= 0 && count <= held,
             "[data] shard '{}' promises {} tokens but holds {} (truncated?)", path, count, held);
  ++set.files;
  (width == 2 ? set.bits16 : set.bits32) += 1;
  if (count == 0) return;
  BinShardSource::Shards::Shard s;
  s.path = path;
  s.count = count;
  s.first = set.total;
  s.width = width;
  set.total += count;
  set.shards.push_back(std::move(s));
}

std::shared_ptr<const BinShardSource::Shards> map_shards(const std::string& spec, int64_t vocab) {
  auto set = std::make_shared<BinShardSource::Shards>();
  set->vocab = vocab;
  for (const std::string& path : shard_files(spec)) map_shard(path, *set);
  return set;
}

std::string shard_description(const std::string& spec, const BinShardSource::Shards& set) {
  const char* width = set.bits32 == 0 ? "uint16" : set.bits16 == 0 ? "uint32" : "uint16+uint32";
  return fmt::format("{} ({} shard(s), {} tokens, {})", spec, set.files, set.total, width);
}

// Tokens [off, off + k) of shard s, read with pread; a short read (the shard was truncated or
// replaced since it was opened) names the file and the offset.
void read_tokens(const BinShardSource::Shards::Shard& s, int64_t off, int64_t k,
                 std::vector<unsigned char>& buf) {
  buf.resize(size_t(k * s.width));
  const int fd = open_regular(s.path, "[data] shard");
  const off_t at = off_t(kHeaderBytes + off * s.width);
  size_t done = 0;
  int err = 0;
  while (done < buf.size()) {
    const ssize_t r = ::pread(fd, buf.data() + done, buf.size() - done, at + off_t(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      err = r < 0 ? errno : 0;
      break;
    }
    done += size_t(r);
  }
  ::close(fd);
  FSDP_CHECK(done == buf.size(),
             "[data] shard '{}': reading {} bytes at offset {} got {} ({}); the shard was "
             "truncated or replaced during training (its header promised {} tokens)",
             s.path, buf.size(), at, done, err ? std::strerror(err) : "end of file", s.count);
}

template <typename T>
void copy_checked(const BinShardSource::Shards::Shard& s, const unsigned char* bytes, int64_t off,
                  int64_t k, int64_t vocab, int32_t* out) {
  for (int64_t i = 0; i < k; ++i) {
    T id;
    std::memcpy(&id, bytes + i * int64_t(sizeof(T)), sizeof(T));
    FSDP_CHECK(int64_t(id) < vocab,
               "[data] shard '{}': token id {} at position {} is not below vocab {}", s.path, id,
               off + i, vocab);
    out[i] = int32_t(id);
  }
}

}  // namespace

BinShardSource::BinShardSource(const std::string& spec, int64_t vocab, int64_t seq)
    : BinShardSource(map_shards(spec, vocab), 0, -1, spec, seq) {}

BinShardSource::BinShardSource(std::shared_ptr<const Shards> shards, int64_t offset, int64_t size,
                               std::string description, int64_t seq)
    : TokenStream(size < 0 ? shards->total : size,
                  size < 0 ? shard_description(description, *shards) : description, seq),
      shards_(std::move(shards)),
      offset_(offset) {}

void BinShardSource::copy(int64_t begin, int64_t count, int32_t* out) const {
  const auto& list = shards_->shards;
  int64_t pos = offset_ + begin;
  // The shard that holds `pos`: the last one whose first token is at or before it.
  auto it = std::upper_bound(list.begin(), list.end(), pos,
                             [](int64_t p, const Shards::Shard& s) { return p < s.first; });
  --it;
  std::vector<unsigned char> buf;
  while (count > 0) {
    const Shards::Shard& s = *it;
    const int64_t off = pos - s.first, k = std::min(count, s.count - off);
    read_tokens(s, off, k, buf);
    if (s.width == 2)
      copy_checked<uint16_t>(s, buf.data(), off, k, shards_->vocab, out);
    else
      copy_checked<uint32_t>(s, buf.data(), off, k, shards_->vocab, out);
    out += k;
    pos += k;
    count -= k;
    ++it;
  }
}

std::unique_ptr<TokenStream> BinShardSource::slice(int64_t begin, int64_t end,
                                                   std::string description, int64_t seq) const {
  return std::unique_ptr<TokenStream>(
      new BinShardSource(shards_, offset_ + begin, end - begin, std::move(description), seq));
}

namespace {

template <typename T>
void write_shard(const std::string& path, const std::vector<T>& tokens, int32_t magic,
                 int32_t version) {
  FSDP_CHECK(tokens.size() <= size_t(INT32_MAX),
             "[data] shard '{}' would hold {} tokens; a header counts at most {}", path,
             tokens.size(), INT32_MAX);
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = int32_t(tokens.size());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(header.data()), kHeaderBytes);
  f.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * sizeof(T)));
  FSDP_CHECK(f.good(), "[data] writing shard '{}' failed", path);
}

}  // namespace

void write_bin_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  write_shard(path, tokens, kShardMagic, 1);
}

void write_bin_shard_u32(const std::string& path, const std::vector<uint32_t>& tokens) {
  write_shard(path, tokens, kShardMagic32, 7);
}

}  // namespace fsdp::data
