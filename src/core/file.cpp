#include "fsdp/core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
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

void write_file_atomic(const std::string& path, std::string_view text, const std::string& where,
                       bool durable) {
  AtomicFile f(path, where);
  f.write(text);
  f.commit(durable);
}

}  // namespace fsdp
