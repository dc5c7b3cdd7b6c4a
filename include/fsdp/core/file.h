// A file written whole or not at all: the bytes go to PATH.tmp.<pid>, every
// write, the fsync and the close are checked, and commit() renames it over
// PATH (then fsyncs the folder). An error names the file and errno's words; a
// file that was not committed is removed by the destructor, on every error
// path, so a full disk never leaves a partial file or a stray temporary.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fsdp {

class AtomicFile {
 public:
  // where: the message's prefix, e.g. "[gguf]".
  AtomicFile(std::string path, std::string where);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // fsync (durable: checkpoints and exports' final files), close, rename over the path.
  void commit(bool durable = true);
  const std::string& tmp_path() const { return tmp_; }

 private:
  std::string path_, tmp_, where_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes text to path through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view text, const std::string& where,
                       bool durable = true);

}  // namespace fsdp
