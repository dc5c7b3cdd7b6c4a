// The reading path for untrusted JSON (json_read.h): a size check, a linear depth scan that
// names where the nesting passes the limit, then nlohmann's parser. The scan keeps the path of
// keys and indexes down to the limit only, so its memory is bounded whatever the input.
#include "src/core/json_read.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/file.h"

namespace fsdp::json_read {

using json = nlohmann::json;

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || (n > 1 && c < 0xc2) || c > 0xf4 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  if (n == 3 && c == 0xe0 && b(i + 1) < 0xa0) return 0;   // overlong
  if (n == 3 && c == 0xed && b(i + 1) >= 0xa0) return 0;  // surrogate
  if (n == 4 && c == 0xf0 && b(i + 1) < 0x90) return 0;   // overlong
  if (n == 4 && c == 0xf4 && b(i + 1) >= 0x90) return 0;  // past U+10FFFF
  return n;
}

struct Frame {
  bool object;
  bool expect_key;
  size_t index;
  std::string key;  // the current key, its first 40 bytes
};

std::string path_of(const std::vector<Frame>& frames) {
  std::string out;
  size_t shown = 0;
  for (const Frame& f : frames) {
    if (out.size() > 60) {
      out += fmt::format("... ({} more levels)", frames.size() - shown);
      break;
    }
    if (f.object) {
      if (!out.empty()) out += '.';
      out += printable(f.key, 40);
    } else {
      out += fmt::format("[{}]", f.index);
    }
    ++shown;
  }
  return out.empty() ? "the top level" : out;
}

void brief_into(const json& v, size_t max_chars, std::string& out) {
  if (out.size() >= max_chars) return;
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    const json cut = s.size() > max_chars ? s.substr(0, max_chars) : s;
    out += cut.dump(-1, ' ', false, json::error_handler_t::replace);
  } else if (v.is_array()) {
    out += '[';
    bool first = true;
    for (const json& e : v) {
      if (out.size() >= max_chars) return;
      if (!first) out += ',';
      first = false;
      brief_into(e, max_chars, out);
    }
    out += ']';
  } else if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, e] : v.items()) {
      if (out.size() >= max_chars) return;
      if (!first) out += ',';
      first = false;
      out += json(k.size() > max_chars ? k.substr(0, max_chars) : k)
                 .dump(-1, ' ', false, json::error_handler_t::replace);
      out += ':';
      brief_into(e, max_chars, out);
    }
    out += '}';
  } else {
    out += v.dump();  // a number, a boolean, null, or binary: short
  }
}

}  // namespace

std::string printable(std::string_view s, size_t max_chars) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c >= 0x20 && c != 0x7f ? utf8_length(s, i) : 0;
    if (n == 0) {
      out += fmt::format("\\x{:02X}", c);
    } else {
      out.append(s.substr(i, n));
      i += n - 1;
    }
  }
  return out;
}

bool is_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_safe(std::string_view s) {
  if (is_utf8(s)) return std::string(s);
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_length(s, i);
    if (n == 0) {
      out += fmt::format("\\x{:02X}", static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string depth_error(std::string_view text) {
  std::vector<Frame> frames;
  bool in_string = false, escape = false;
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        in_string = false;
        if (!frames.empty() && frames.back().object) frames.back().expect_key = false;
      } else if (!frames.empty() && frames.back().object && frames.back().expect_key &&
                 frames.back().key.size() < 40) {
        frames.back().key += c;
      }
      continue;
    }
    switch (c) {
      case '\n':
        ++line;
        line_start = i + 1;
        break;
      case '"':
        in_string = true;
        if (!frames.empty() && frames.back().object && frames.back().expect_key)
          frames.back().key.clear();
        break;
      case '{':
      case '[':
        if (frames.size() == size_t(kMaxDepth))
          return fmt::format(
              "nests deeper than {} levels (the limit) at line {}, column {}, byte {}, in {}",
              kMaxDepth, line, i - line_start + 1, i, path_of(frames));
        frames.push_back({c == '{', c == '{', 0, {}});
        break;
      case '}':
      case ']':
        if (!frames.empty()) frames.pop_back();
        break;
      case ',':
        if (!frames.empty()) {
          if (frames.back().object)
            frames.back().expect_key = true;
          else
            ++frames.back().index;
        }
        break;
      default:
        break;
    }
  }
  return {};
}

json parse(std::string_view text, const std::string& where, const char* source,
           uint64_t max_bytes) {
  FSDP_CHECK(text.size() <= max_bytes,
             "{} {}: {} bytes of JSON is more than the limit of {} MiB for this file", source,
             where, text.size(), max_bytes >> 20);
  if (const std::string deep = depth_error(text); !deep.empty())
    FSDP_FAIL("{} {}: the JSON {}", source, where, deep);
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    FSDP_FAIL("{} {}: not valid JSON: {}", source, where, printable(e.what(), 300));
  }
}

json parse_file(const std::string& path, const char* source, uint64_t max_bytes) {
  const int fd = open_regular(path, source);
  struct stat st {};
  if (fstat(fd, &st) != 0 || uint64_t(st.st_size) > max_bytes) {
    const uint64_t size = uint64_t(st.st_size);
    ::close(fd);
    FSDP_FAIL("{} {}: {} bytes of JSON is more than the limit of {} MiB for this file", source,
              path, size, max_bytes >> 20);
  }
  std::string text(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      FSDP_FAIL("{} cannot read '{}': {}", source, path,
                err ? std::strerror(err) : "the file ended early (it shrank while read)");
    }
    got += size_t(n);
  }
  ::close(fd);
  return parse(text, path, source, max_bytes);
}

std::string brief(const json& v, size_t max_chars) {
  std::string out;
  brief_into(v, max_chars + 1, out);  // one past the limit says that there was more
  if (out.size() > max_chars) {
    out.resize(max_chars);
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xc0) == 0x80) out.pop_back();
    if (!out.empty() && static_cast<unsigned char>(out.back()) >= 0xc0) out.pop_back();
    out += "...";
  }
  return out;
}

}  // namespace fsdp::json_read
