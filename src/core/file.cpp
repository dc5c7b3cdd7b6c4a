#include "fsdp/core/file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <utility>

#include "fsdp/core/error.h"

namespace fsdp {

AtomicFile::AtomicFile(std::string path, std::string where)
    : path_(std::move(path)),
      tmp_(fmt::format("{}.tmp.{}", path_, ::getpid())),
      where_(std::move(where)) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  FSDP_CHECK(fd_ >= 0, "{} cannot create '{}': {}", where_, tmp_, std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  FSDP_CHECK(fd_ >= 0 && !committed_, "{} '{}' is already closed", where_, tmp_);
  const char* c = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, c, n);
    if (w < 0 && errno == EINTR) continue;
    FSDP_CHECK(w > 0, "{} writing '{}' failed: {} ({} bytes not written; the file was removed)",
               where_, path_, std::strerror(w < 0 ? errno : ENOSPC), n);
    c += w;
    n -= size_t(w);
  }
}

void AtomicFile::commit(bool durable) {
  FSDP_CHECK(fd_ >= 0 && !committed_, "{} '{}' is already closed", where_, tmp_);
  if (durable)
    FSDP_CHECK(::fsync(fd_) == 0, "{} fsync of '{}' failed: {} (the file was removed)", where_,
               path_, std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  FSDP_CHECK(::close(fd) == 0, "{} closing '{}' failed: {} (the file was removed)", where_, path_,
             std::strerror(errno));
  FSDP_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0,
             "{} rename '{}' -> '{}' failed: {} (the file was removed)", where_, tmp_, path_,
             std::strerror(errno));
  committed_ = true;
  if (durable) {  // the rename itself
    std::string dir = std::filesystem::path(path_).parent_path().string();
    const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
}

namespace {

const char* kind_of(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISDIR(m)) return "a directory";
  return "not a plain file";
}

// fd open on path: throws (closing fd) unless it is a regular file.
void require_regular(int fd, const std::string& path, const std::string& where) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    FSDP_FAIL("{} cannot stat '{}': {}", where, path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    FSDP_FAIL("{} '{}' is not a regular file (it is {}); refusing to use it", where, path,
              kind_of(st.st_mode));
  }
}

}  // namespace

int open_regular(const std::string& path, const std::string& where) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  FSDP_CHECK(fd >= 0, "{} cannot open '{}': {}", where, path, std::strerror(errno));
  require_regular(fd, path, where);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void check_regular(const std::string& path, const std::string& where) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;  // the reader's own open names a missing or unreadable file
  require_regular(fd, path, where);
  ::close(fd);
}

int open_for_write(const std::string& path, int flags, const std::string& where) {
  // O_NONBLOCK: a FIFO there must not block the open (it is refused below).
  const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ELOOP)
    FSDP_FAIL("{} '{}' is a symbolic link; refusing to write through it (remove it)", where, path);
  if (fd < 0 && errno == ENXIO)  // a FIFO with no reader
    FSDP_FAIL("{} '{}' is not a regular file (it is a FIFO); refusing to use it", where, path);
  FSDP_CHECK(fd >= 0, "{} cannot open '{}': {}", where, path, std::strerror(errno));
  require_regular(fd, path, where);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

namespace {
// Whether the resolved path p lies under the resolved folder dir (both canonical).
bool lies_under(const std::filesystem::path& p, const std::filesystem::path& dir) {
  const std::filesystem::path rel = p.lexically_relative(dir);
  return !rel.empty() && *rel.begin() != "..";
}
}  // namespace

void check_inside_folder(const std::string& folder, const std::string& file,
                         const std::string& where) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root = fs::canonical(folder.empty() ? "." : folder, ec);
  if (ec) return;
  const fs::path target = fs::canonical(file, ec);
  if (ec) return;  // missing, or a dangling link: the reader's open names it
  if (lies_under(target, root)) return;
  if (root.parent_path().filename() == "snapshots") {  // a Hugging Face cache's snapshot
    const fs::path blobs = fs::canonical(root.parent_path().parent_path() / "blobs", ec);
    if (!ec && lies_under(target, blobs)) return;
  }
  FSDP_FAIL(
      "{} '{}' leads to '{}', outside the model folder '{}' (through a symbolic link or '..'): "
      "the files a model folder names are read only inside its tree (a Hugging Face cache's "
      "links from snapshots/ into its blobs/ folder excepted); refusing to read it",
      where, file, target.string(), root.string());
}

void write_file_atomic(const std::string& path, std::string_view text, const std::string& where,
                       bool durable) {
  AtomicFile f(path, where);
  f.write(text);
  f.commit(durable);
}

namespace {

// The SIGBUS guard's table: fixed slots, filled under a mutex and read by the handler without one
// (a slot's range is published last, with release order, and cleared first).
struct MappedSlot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  char path[512] = {};
  char where[32] = {};
};
std::array<MappedSlot, 256> g_mapped;
std::mutex g_mapped_mu;
struct sigaction g_prev_bus {};
std::atomic<bool> g_bus_installed{false};

// Async-signal-safe output: write(2) of literal pieces and unsigned decimals.
void put(const char* s) {
  const size_t n = std::strlen(s);
  ssize_t r = ::write(2, s, n);
  (void)r;
}
void put_u(uint64_t v) {
  char buf[24];
  int i = 23;
  buf[i] = 0;
  do {
    buf[--i] = char('0' + v % 10);
    v /= 10;
  } while (v > 0 && i > 0);
  put(buf + i);
}

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  (void)ctx;
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  // Only a fault's si_addr is an address (a kill(2)'s SIGBUS has si_code <= 0 and a pid there).
  for (size_t i = 0; info->si_code > 0 && i < g_mapped.size(); ++i) {
    const MappedSlot& s = g_mapped[i];
    const uintptr_t b = s.begin.load(std::memory_order_acquire);
    const uintptr_t e = s.end.load(std::memory_order_acquire);
    if (b == 0 || addr < b || addr >= e) continue;
    struct stat st {};
    const bool now = ::stat(s.path, &st) == 0;
    put("\n");
    put(s.where);
    put(" '");
    put(s.path);
    put("' was truncated or rewritten while it was being read: offset ");
    put_u(addr - b);
    put(" of the ");
    put_u(e - b);
    put(" bytes mapped");
    if (now) {
      put(", and the file now has ");
      put_u(uint64_t(st.st_size));
      put(" bytes");
    }
    put(". Leave a model or data file unchanged while a run reads it; stopping\n");
    ::_exit(1);
  }
  // Not one of ours: the disposition that was there before (a launcher's backtrace printer, with
  // its own flags, or the default) takes the signal again. A fault re-executes under it when this
  // returns; a signal sent by kill(2) is sent again.
  ::sigaction(SIGBUS, &g_prev_bus, nullptr);
  g_bus_installed.store(false);
  if (info->si_code <= 0) ::raise(sig);
}

void install_bus_guard() {
  if (g_bus_installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO;
  ::sigaction(SIGBUS, &sa, &g_prev_bus);
}

}  // namespace

std::shared_ptr<uint8_t> map_file(const std::string& path, const std::string& where,
                                  uint64_t* size, bool writable) {
  const int fd = open_regular(path, where);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    FSDP_FAIL("{} cannot stat '{}': {}", where, path, std::strerror(e));
  }
  const auto n = uint64_t(st.st_size);
  *size = n;
  if (n == 0) {
    ::close(fd);
    return nullptr;
  }
  void* base = ::mmap(nullptr, size_t(n), PROT_READ | (writable ? PROT_WRITE : 0), MAP_PRIVATE,
                      fd, 0);
  const int e = errno;
  ::close(fd);
  FSDP_CHECK(base != MAP_FAILED, "{} mmap of '{}' ({} bytes) failed: {}", where, path, n,
             std::strerror(e));
  install_bus_guard();
  MappedSlot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mapped_mu);
    for (MappedSlot& s : g_mapped)
      if (s.begin.load(std::memory_order_relaxed) == 0) {
        slot = &s;
        std::snprintf(s.path, sizeof s.path, "%s", path.c_str());
        std::snprintf(s.where, sizeof s.where, "%s", where.c_str());
        s.end.store(reinterpret_cast<uintptr_t>(base) + n, std::memory_order_release);
        s.begin.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
        break;
      }
  }
  // With every slot taken (256 files mapped at once) the mapping works, unguarded.
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(base), [n, slot](uint8_t* p) {
    if (slot != nullptr) {
      std::lock_guard<std::mutex> lock(g_mapped_mu);
      slot->begin.store(0, std::memory_order_release);
      slot->end.store(0, std::memory_order_release);
    }
    ::munmap(p, size_t(n));
  });
}

void release_mapped_pages(const uint8_t* base, uint64_t size) {
  if (base == nullptr || size == 0) return;
  const auto page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(base) + size + page - 1) / page * page;
  (void)::madvise(reinterpret_cast<void*>(begin), size_t(end - begin), MADV_DONTNEED);
}

}  // namespace fsdp
