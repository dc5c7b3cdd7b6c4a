// The files a data spec names (src/data/data_files.h), and data_identity
// (fsdp/data/token_sources.h): what the data is by content, every byte hashed (or sampled).
#include "src/data/data_files.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "fsdp/core/env.h"
#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/data/token_sources.h"
#include "src/core/json_read.h"

namespace fsdp::data {

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

bool has_shard_magic(const std::string& path) {
  check_regular(path, "[data]");
  std::ifstream f(path, std::ios::binary);
  int32_t magic = 0;
  f.read(reinterpret_cast<char*>(&magic), 4);
  return f.good() && (magic == kShardMagic || magic == kShardMagic32);
}

bool names_jsonl_samples(const std::string& spec) {
  namespace fs = std::filesystem;
  std::string ext = fs::path(spec).extension().string();
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".jsonl") return true;
  std::error_code ec;
  // Directories and globs are shards; a FIFO or a device is refused by its reader, unopened.
  if (!fs::is_regular_file(spec, ec) || has_shard_magic(spec)) return false;
  // The first line, or its first 1 MiB: enough to see what the file is.
  std::ifstream f(spec, std::ios::binary);
  std::string line;
  for (char c; line.size() < (size_t(1) << 20) && f.get(c) && c != '\n';) line.push_back(c);
  size_t at = line.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;  // a UTF-8 byte order mark
  while (at < line.size() && std::isspace(static_cast<unsigned char>(line[at]))) ++at;
  if (at < line.size() && line[at] == '{' &&
      (line.find("\"messages\"") != std::string::npos ||
       line.find("\"input_ids\"") != std::string::npos))
    return true;
  FSDP_CHECK(ext != ".json",
             "[data] {} is a .json file but not JSONL samples: its first line is not a JSON "
             "object with \"messages\" or \"input_ids\" ({}). --data takes samples as one JSON "
             "object per line ({{\"messages\": [{{\"role\": ..., \"content\": ...}}]}} or "
             "{{\"input_ids\": [...]}}), in a .jsonl file; a text file is trained on as text "
             "under another extension",
             spec,
             at >= line.size() ? "it starts with an empty line"
             : line[at] == '[' ? "it starts with '[': a JSON array; write one element per line"
             : line[at] == '{' ? "an object without them, or one spread over several lines"
                               : "it does not start with '{'");
  return false;
}

bool names_shards(const std::string& spec) {
  std::error_code ec;
  return std::filesystem::is_directory(spec, ec) || spec.find_first_of("*?[") != std::string::npos ||
         (std::filesystem::is_regular_file(spec, ec) &&
          (has_shard_magic(spec) || std::filesystem::path(spec).extension() == ".bin"));
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

std::string DataIdentity::str() const {
  return fmt::format("{} bytes in {} file(s), {} hash {:016x}", bytes, files,
                     full ? "content" : "sample", hash);
}

namespace {

// The full hash's cache: data_hashes.json in cache_dir(), an object from a key of every file's
// path, device, inode, size, mtime and ctime (in ns) to the identity. A file whose mtime or ctime
// is under kSettleNs old is neither cached nor looked up (a rewrite within the same clock tick
// keeps both times: git's "racy" case); any later write moves the ctime past a cached entry's.
// A cache that cannot be read or written is ignored: the hash is computed.
constexpr int64_t kSettleNs = 2'000'000'000;
constexpr size_t kCacheEntries = 256;

std::string hash_cache_path() {
  return (std::filesystem::path(cache_dir()) / "data_hashes.json").string();
}

uint64_t fnv64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// An entry's name (of every file's path, device, inode, size and times, hashed, with the hash
// scheme's version) and its files' (of the paths alone: a newer entry replaces the older one of
// the same files). Empty when a file is too fresh to cache.
struct CacheKey {
  std::string id, paths;
};

CacheKey hash_cache_key(const std::vector<std::string>& files) {
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = int64_t(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
  std::string key, paths;
  for (const std::string& f : files) {
    struct stat st {};
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(f, ec);
    if (ec || ::stat(f.c_str(), &st) != 0) return {};
    const int64_t m = int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
    const int64_t c = int64_t(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
    if (now_ns - std::max(m, c) < kSettleNs) return {};
    key += fmt::format("{}|{}|{}|{}|{}|{};", abs.string(), uint64_t(st.st_dev), uint64_t(st.st_ino),
                       int64_t(st.st_size), m, c);
    paths += abs.string() + ";";
  }
  return {fmt::format("content-v1-{:016x}", fnv64(key)), fmt::format("{:016x}", fnv64(paths))};
}

nlohmann::json read_hash_cache() {
  const std::string path = hash_cache_path();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(std::filesystem::symlink_status(path, ec)))
    return nlohmann::json::object();  // none yet, or not a file to read (a FIFO would block)
  std::ifstream f(path);
  if (!f.good()) return nlohmann::json::object();
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  // nested past the limit: ignored like a damaged cache (writing it back would recurse per level)
  if (!json_read::depth_error(text).empty()) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

std::optional<DataIdentity> cached_identity(const CacheKey& key) {
  if (key.id.empty()) return std::nullopt;
  const nlohmann::json j = read_hash_cache();
  const auto it = j.find(key.id);
  if (it == j.end() || !it->is_object()) return std::nullopt;
  const nlohmann::json& e = *it;
  if (!e.contains("files") || !e["files"].is_number_integer() || !e.contains("bytes") ||
      !e["bytes"].is_number_integer() || !e.contains("hash") || !e["hash"].is_string())
    return std::nullopt;
  DataIdentity id;
  id.files = e["files"].get<int64_t>();
  id.bytes = e["bytes"].get<int64_t>();
  const std::string h = e["hash"].get<std::string>();
  if (h.size() != 16 || h.find_first_not_of("0123456789abcdef") != std::string::npos)
    return std::nullopt;
  id.hash = std::stoull(h, nullptr, 16);
  id.full = true;
  return id;
}

void cache_identity(const CacheKey& key, const DataIdentity& id) {
  if (key.id.empty()) return;
  try {
    nlohmann::json j = read_hash_cache();
    for (auto it = j.begin(); it != j.end();)  // the same files' older entry
      it = it->is_object() && it->value("paths", "") == key.paths ? j.erase(it) : std::next(it);
    while (j.size() >= kCacheEntries) {  // the least recently written goes
      auto oldest = j.begin();
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it->is_object() && it->value("used", int64_t(0)) < oldest->value("used", int64_t(0)))
          oldest = it;
      j.erase(oldest);
    }
    j[key.id] = {{"files", id.files},
                 {"bytes", id.bytes},
                 {"hash", fmt::format("{:016x}", id.hash)},
                 {"paths", key.paths},
                 {"used", int64_t(::time(nullptr))}};
    std::error_code ec;
    std::filesystem::create_directories(cache_dir(), ec);
    write_file_atomic(hash_cache_path(), j.dump(1) + "\n", "[data]", /*durable=*/false);
  } catch (const std::exception&) {  // a cache that cannot be written: the next run hashes again
  }
}

}  // namespace

DataIdentity data_identity(const std::string& spec, bool full) {
  const bool shards = names_shards(spec);
  std::vector<std::string> files = {spec};
  if (shards)
    files = shard_files(spec);
  else
    check_regular_file(spec);
  const CacheKey key = full ? hash_cache_key(files) : CacheKey{};
  if (std::optional<DataIdentity> hit = cached_identity(key)) return *hit;
  constexpr int64_t kSample = 4096, kSamples = 16;
  DataIdentity id;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, 64-bit
  auto mix = [&h](const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  };
  std::vector<unsigned char> buf(static_cast<size_t>(kSample));
  for (const std::string& path : files) {
    const int fd = open_regular(path, "[data] data file");
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    FSDP_CHECK(::fstat(fd, &st) == 0, "[data] cannot stat data file '{}': {}", path,
               std::strerror(errno));
    const int64_t size = int64_t(st.st_size);
    mix(reinterpret_cast<const unsigned char*>(&size), sizeof(size));
    if (full) {  // every byte, in 1 MiB reads: 8-byte words over 4 lanes, then the tail
      std::vector<uint64_t> words(size_t(1) << 17);
      uint64_t lane[4] = {h, h ^ 1, h ^ 2, h ^ 3};
      for (int64_t at = 0; at < size;) {
        const ssize_t got = ::pread(fd, words.data(), words.size() * 8, off_t(at));
        FSDP_CHECK(got >= 0, "[data] reading data file '{}' failed: {}", path,
                   std::strerror(errno));
        FSDP_CHECK(got > 0, "[data] data file '{}' shrank to {} bytes while it was read", path, at);
        const size_t n = size_t(got) / 8;
        for (size_t i = 0; i < n; ++i) {
          uint64_t& x = lane[i & 3];
          x = (x ^ words[i]) * 0x9e3779b97f4a7c15ull;
          x ^= x >> 29;
        }
        mix(reinterpret_cast<const unsigned char*>(words.data()) + n * 8, size_t(got) - n * 8);
        at += got;
      }
      mix(reinterpret_cast<const unsigned char*>(lane), sizeof(lane));
      ++id.files;
      id.bytes += size;
      continue;
    }
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
  id.full = full;
  if (full) cache_identity(key, id);
  return id;
}

}  // namespace fsdp::data
