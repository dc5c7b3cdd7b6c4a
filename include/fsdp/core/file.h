// A file written whole or not at all: the bytes go to PATH.tmp.<pid>, every
// write, the fsync and the close are checked, and commit() renames it over
// PATH (then fsyncs the folder). An error names the file and errno's words; a
// file that was not committed is removed by the destructor, on every error
// path, so a full disk never leaves a partial file or a stray temporary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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

// A file the project reads: opened O_NONBLOCK (so a FIFO never blocks the open itself), then
// fstat'ed, and refused at once unless it is a regular file: a FIFO, a socket or a device
// (/dev/zero) would hang or never end a read. Returns the descriptor, O_NONBLOCK cleared;
// the error names the file and what it is.
int open_regular(const std::string& path, const std::string& where);
// The same check for a reader that opens the file itself (an ifstream): throws unless path is
// a regular file; a path that does not exist is left to the reader's own error.
void check_regular(const std::string& path, const std::string& where);
// A file the project writes in place (a lock, a probe, a log): opened with O_NOFOLLOW, so a
// symbolic link there is refused by name instead of written through, and refused unless it is
// a regular file. flags: O_WRONLY/O_RDWR plus O_CREAT, O_TRUNC or O_APPEND as wanted.
int open_for_write(const std::string& path, int flags, const std::string& where);

// Maps a whole file the project reads (opened with open_regular) read-only and private. The
// range is registered with a SIGBUS guard for as long as the mapping lives: a file truncated or
// rewritten under the mapping (a page past its new end) would kill the process with a bare
// "Bus error"; the guard instead writes "<where> '<path>' was truncated while it was being read:
// offset X of the N bytes mapped, the file now has M bytes" to stderr and exits 1. writable:
// PROT_WRITE as well (copy-on-write: the file is never changed). Sets *size to the file's size; a
// 0-byte file gives a null pointer.
std::shared_ptr<uint8_t> map_file(const std::string& path, const std::string& where,
                                  uint64_t* size, bool writable = false);
// Gives back the resident pages of a read-only mapping from map_file (madvise MADV_DONTNEED): a
// later read faults them in from the file again. Not for a writable one (its written pages would
// be lost).
void release_mapped_pages(const uint8_t* base, uint64_t size);

// A file that a folder names (a model folder's config.json, tokenizer.json, chat_template.jinja,
// weights), checked to lie inside that folder's tree once every link is resolved: a downloaded
// model whose chat_template.jinja links to ~/.cache/huggingface/token had that file's text
// printed and copied into checkpoints and exports. One exception: in a Hugging Face cache a
// folder .../snapshots/<rev> links its files to ../../blobs/<hash>, so the blobs/ folder beside
// snapshots/ counts as inside. A file that does not exist (or cannot be resolved) is left to the
// reader's own error. Throws naming the file, where its link leads and the folder. The check
// resolves the path before the reader opens it: it guards against what a folder holds, not
// against a concurrent writer of the folder.
void check_inside_folder(const std::string& folder, const std::string& file,
                         const std::string& where);

// Writes text to path through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view text, const std::string& where,
                       bool durable = true);

}  // namespace fsdp
