// llm.c's token shards as a token source (BinShardSource, fsdp/data/token_sources.h), and the
// shard writer. Key decision: a shard is mmap'ed read-only and a batch row copies its T + 1
// tokens out of the mapping, checking each against the vocab, then drops those pages from this
// process (madvise DONTNEED; the page cache keeps them), so a rank's resident memory is its rows,
// whatever the corpus' size.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

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
#include "fsdp/data/token_sources.h"
#include "src/data/data_files.h"

namespace fsdp::data {

// The mapped shards: each one's tokens, their width, and where they start in the stream.
struct BinShardSource::Shards {
  struct Shard {
    std::string path;
    void* map = nullptr;
    size_t map_bytes = 0;
    const unsigned char* tokens = nullptr;
    int64_t count = 0, first = 0;  // tokens, and the stream position of the first
    int width = 2;                 // bytes per token
  };
  std::vector<Shard> shards;  // the non-empty ones, in stream order
  int64_t files = 0, total = 0, vocab = 0, bits16 = 0, bits32 = 0;
  Shards() = default;
  Shards(const Shards&) = delete;
  Shards& operator=(const Shards&) = delete;
  ~Shards() {
    for (Shard& s : shards)
      if (s.map) ::munmap(s.map, s.map_bytes);
  }
};

namespace {

// Opens, checks and maps one shard; count 0 leaves it unmapped.
void map_shard(const std::string& path, BinShardSource::Shards& set) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd >= 0, "[data] cannot read shard '{}': {}", path, std::strerror(errno));
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
  s.map_bytes = size_t(kHeaderBytes + count * width);
  s.map = ::mmap(nullptr, s.map_bytes, PROT_READ, MAP_SHARED, fd, 0);
  FSDP_CHECK(s.map != MAP_FAILED, "[data] cannot map shard '{}' ({} bytes): {}", path, s.map_bytes,
             std::strerror(errno));
  s.tokens = static_cast<const unsigned char*>(s.map) + kHeaderBytes;
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
  return fmt::format("{} ({} shard(s), {} tokens, {}, mapped)", spec, set.files, set.total, width);
}

template <typename T>
void copy_checked(const BinShardSource::Shards::Shard& s, int64_t off, int64_t k, int64_t vocab,
                  int32_t* out) {
  const T* p = reinterpret_cast<const T*>(s.tokens) + off;
  for (int64_t i = 0; i < k; ++i) {
    const T id = p[i];
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
  const long page = ::sysconf(_SC_PAGESIZE);
  while (count > 0) {
    const Shards::Shard& s = *it;
    const int64_t off = pos - s.first, k = std::min(count, s.count - off);
    if (s.width == 2)
      copy_checked<uint16_t>(s, off, k, shards_->vocab, out);
    else
      copy_checked<uint32_t>(s, off, k, shards_->vocab, out);
    // Give the pages back to the page cache: this rank's resident memory stays its rows. A fault
    // maps more than its page (fault-around, and whole large folios of the page cache, up to
    // 2 MB on ext4 since Linux 6.16), so the range is widened to 2 MB-aligned blocks, within
    // the mapping; a later row there faults its pages in again from the cache.
    const uintptr_t begin = uintptr_t(s.map), end = begin + s.map_bytes;
    const uintptr_t block = std::max<uintptr_t>(uintptr_t(page), kMapBlockBytes);
    const uintptr_t lo = std::max(begin, uintptr_t(s.tokens + off * s.width) & ~(block - 1));
    const uintptr_t hi =
        std::min(end, (uintptr_t(s.tokens + (off + k) * s.width) + block - 1) & ~(block - 1));
    ::madvise(reinterpret_cast<void*>(lo), size_t(hi - lo), MADV_DONTNEED);
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
