#include "fsdp/core/file.h"

#include <fcntl.h>
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
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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

void write_file_atomic(const std::string& path, std::string_view text, const std::string& where,
                       bool durable) {
  AtomicFile f(path, where);
  f.write(text);
  f.commit(durable);
}

}  // namespace fsdp
