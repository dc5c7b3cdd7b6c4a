// Token streams (bytes in memory, llm.c shards memory-mapped) and random tokens.
// Key decision: a shard is mmap'ed read-only and a batch row copies its T + 1
// tokens out of the mapping, checking each against the vocab, then drops those
// pages from this process (madvise DONTNEED; the page cache keeps them), so a
// rank's resident memory is its rows, whatever the corpus' size.
#include "fsdp/data/text_dataset.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <type_traits>

#include "fsdp/nn/init.h"

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
  Batch b{Tensor::empty({rows, seq}, DType::i32), Tensor::empty({rows, seq}, DType::i32)};
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

// A data file must be a regular file: a FIFO, a device or a socket is refused by name before it is
// opened (--data /dev/zero read forever while memory grew; opening a FIFO blocks).
void check_regular_file(const std::string& path) {
  struct stat st {};
  FSDP_CHECK(::stat(path.c_str(), &st) == 0, "[data] cannot open data file '{}': {}", path,
             std::strerror(errno));
  const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO (named pipe)"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                     : S_ISDIR(st.st_mode)  ? "a directory"
                                            : "not a regular file";
  FSDP_CHECK(S_ISREG(st.st_mode),
             "[data] data file '{}' is {}; expected a regular file (or a directory of .bin shards)",
             path, kind);
}

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

constexpr int32_t kShardMagic = 20240520;    // llm.c GPT-2: version 1, uint16 tokens
constexpr int32_t kShardMagic32 = 20240801;  // llm.c Llama 3: version 7, uint32 tokens
constexpr int64_t kHeaderBytes = 256 * 4;
constexpr uintptr_t kMapBlockBytes = 2 << 20;  // the largest folio a fault may map (a PMD)

bool has_shard_magic(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  int32_t magic = 0;
  f.read(reinterpret_cast<char*>(&magic), 4);
  return f.good() && (magic == kShardMagic || magic == kShardMagic32);
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
  for (const std::string& f : files) check_regular_file(f);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

ByteTextSource::ByteTextSource(const std::string& path, int64_t vocab, int64_t seq)
    : TokenVector(read_bytes(path, vocab), path, seq) {
  description_ = fmt::format("{} ({} bytes)", path, tokens_.size());
}

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

std::string DataIdentity::str() const {
  return fmt::format("{} bytes in {} file(s), sample hash {:016x}", bytes, files, hash);
}

DataIdentity data_identity(const std::string& spec) {
  std::error_code ec;
  const bool shards =
      std::filesystem::is_directory(spec, ec) || spec.find_first_of("*?[") != std::string::npos ||
      (std::filesystem::is_regular_file(spec, ec) &&
       (has_shard_magic(spec) || std::filesystem::path(spec).extension() == ".bin"));
  std::vector<std::string> files = {spec};
  if (shards) files = shard_files(spec);
  else check_regular_file(spec);
  constexpr int64_t kSample = 4096, kSamples = 16;
  DataIdentity id;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, 64-bit
  auto mix = [&h](const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  };
  std::vector<unsigned char> buf(static_cast<size_t>(kSample));
  for (const std::string& path : files) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    FSDP_CHECK(fd >= 0, "[data] cannot read data file '{}': {}", path, std::strerror(errno));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    FSDP_CHECK(::fstat(fd, &st) == 0, "[data] cannot stat data file '{}': {}", path,
               std::strerror(errno));
    const int64_t size = int64_t(st.st_size);
    mix(reinterpret_cast<const unsigned char*>(&size), sizeof(size));
    // The head (a shard's header), then samples at k/16 of the rest and its last bytes.
    for (int64_t k = 0; k <= kSamples; ++k) {
      const int64_t at = k == 0 ? 0 : std::max<int64_t>(0, (size - kSample) * k / kSamples);
      const ssize_t got = ::pread(fd, buf.data(), size_t(kSample), off_t(at));
      FSDP_CHECK(got >= 0, "[data] reading data file '{}' failed: {}", path, std::strerror(errno));
      mix(buf.data(), size_t(got));
    }
    ++id.files;
    id.bytes += size;
  }
  id.hash = h;
  return id;
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

Batch RandomTokenSource::windows(int64_t first, int64_t rows, int64_t seq) const {
  Batch b{Tensor::empty({rows, seq}, DType::i32), Tensor::empty({rows, seq}, DType::i32)};
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

}  // namespace fsdp::data
