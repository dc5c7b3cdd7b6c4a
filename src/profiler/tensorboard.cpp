// TensorBoard event files (fsdp/profiler/tensorboard.h). The messages, with their field numbers
// (tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto, tensor.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//             SessionLog session_log = 7; }     SessionLog { SessionStatus status = 1 (START 1) }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; TensorProto tensor = 8;
//             SummaryMetadata metadata = 9; }
//   SummaryMetadata { PluginData plugin_data = 1; }   PluginData { string plugin_name = 1; }
//   TensorProto { DataType dtype = 1 (DT_STRING = 7); TensorShapeProto tensor_shape = 2;
//                 repeated bytes string_val = 8; }
#include "fsdp/profiler/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "fsdp/core/error.h"

namespace fsdp::profiler {

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected
    t[i] = c;
  }
  return t;
}

// Protobuf's wire format: a key is (field << 3) | type; 0 varint, 1 fixed64, 2 bytes, 5 fixed32.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void key(std::string& out, int field, int type) { varint(out, uint64_t(field) << 3 | uint64_t(type)); }
void bytes_field(std::string& out, int field, std::string_view b) {
  key(out, field, 2);
  varint(out, b.size());
  out.append(b);
}
template <class T>
void fixed(std::string& out, int field, T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  key(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian, as the wire format
  out.append(b, sizeof(T));
}

std::string event(int64_t step, const std::string* summary, const std::string* version) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string e;
  fixed(e, 1, now);
  key(e, 2, 0);
  varint(e, uint64_t(step));
  if (version) bytes_field(e, 3, *version);
  if (summary) bytes_field(e, 5, *summary);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  FSDP_CHECK(!ec, "[tensorboard] cannot create '{}': {}", dir, ec.message());
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  // TensorBoard reads a folder's files in the order of their names: the start time, to the
  // microsecond and of fixed width, comes first, so that a resumed run's file (whose session
  // start replaces the steps it repeats) is read after the file it continues.
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  static std::atomic<int> count{0};  // two writers of one process at once: two names
  path_ = (std::filesystem::path(dir) /
           fmt::format("events.out.tfevents.{:010d}.{:06d}.{}.{}.{}.fsdp", us / 1000000,
                       us % 1000000, host, ::getpid(), count++))
              .string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  FSDP_CHECK(fd_ >= 0, "[tensorboard] cannot create '{}': {}", path_, std::strerror(errno));
  const std::string version = "brain.Event:2";
  record(event(0, nullptr, &version));
  flush();
}

EventWriter::~EventWriter() {
  if (fd_ < 0) return;
  try {
    flush();
  } catch (...) {  // a destructor does not throw; flush() already named the failure to a caller
  }
  ::close(fd_);
}

void EventWriter::record(const std::string& e) {
  const uint64_t len = e.size();
  char head[12];
  std::memcpy(head, &len, 8);
  const uint32_t hc = masked_crc32c(head, 8);
  std::memcpy(head + 8, &hc, 4);
  buffer_.append(head, 12);
  buffer_.append(e);
  const uint32_t dc = masked_crc32c(e.data(), e.size());
  buffer_.append(reinterpret_cast<const char*>(&dc), 4);
}

void EventWriter::session_start(int64_t step) {
  std::string log;
  key(log, 1, 0);
  varint(log, 1);  // START
  std::string e = event(step, nullptr, nullptr);
  bytes_field(e, 7, log);
  record(e);
}

void EventWriter::scalar(const std::string& tag, int64_t step, double value) {
  std::string v;
  bytes_field(v, 1, tag);
  fixed(v, 2, float(value));
  std::string s;
  bytes_field(s, 1, v);
  record(event(step, &s, nullptr));
}

void EventWriter::text(const std::string& tag, int64_t step, std::string_view text) {
  std::string plugin, meta, tensor, v, s;
  bytes_field(plugin, 1, "text");
  bytes_field(meta, 1, plugin);
  key(tensor, 1, 0);
  varint(tensor, 7);           // DT_STRING
  bytes_field(tensor, 2, "");  // a scalar: a shape with no dims
  bytes_field(tensor, 8, text);
  bytes_field(v, 1, tag);
  bytes_field(v, 8, tensor);
  bytes_field(v, 9, meta);
  bytes_field(s, 1, v);
  record(event(step, &s, nullptr));
}

void EventWriter::flush() {
  const char* p = buffer_.data();
  size_t n = buffer_.size();
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    FSDP_CHECK(w > 0, "[tensorboard] writing '{}' failed: {}", path_,
               std::strerror(w < 0 ? errno : ENOSPC));
    p += w;
    n -= size_t(w);
  }
  buffer_.clear();
}

}  // namespace fsdp::profiler
