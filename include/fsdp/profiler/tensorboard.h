// TensorBoard's event files, written without TensorFlow: each record is TFRecord-framed (its
// length and its bytes each followed by a masked CRC-32C), and each Event message (wall time,
// step, and a Summary of scalars or of text) is encoded by hand in protobuf's wire format.
// TensorBoard's own reader (EventAccumulator) reads them back: tests/tensorboard_test.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fsdp::profiler {

// CRC-32C (Castagnoli), and TFRecord's mask of it.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

class EventWriter {
 public:
  // Creates dir (and its parents) and in it events.out.tfevents.<s>.<us>.<host>.<pid>.<n>.fsdp, with
  // the file-version event first; throws naming the file when either cannot be made. A link at
  // the file's name is refused (opened O_NOFOLLOW | O_EXCL).
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // A session's start at `step` (TensorBoard's SessionLog START): a reader drops the events of
  // an earlier session at this step and after (a resumed run's steps are not shown twice).
  void session_start(int64_t step);
  void scalar(const std::string& tag, int64_t step, double value);  // stored as float32
  // A text summary (TensorBoard's text plugin: a string tensor), e.g. the run's config.
  void text(const std::string& tag, int64_t step, std::string_view text);
  // Writes what is buffered; throws naming the file and errno's words on a failed write.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  std::string buffer_;
  int fd_ = -1;
};

}  // namespace fsdp::profiler
