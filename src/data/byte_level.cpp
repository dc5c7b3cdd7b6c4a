// GPT-2's byte-level pre-tokenization (byte_level.h) and the public gpt2_split and
// byte_to_unicode (fsdp/data/tokenizer.h).
#include "src/data/byte_level.h"

#include <algorithm>
#include <initializer_list>
#include <iterator>
#include <vector>

#include "fsdp/data/tokenizer.h"

namespace fsdp::data {

namespace byte_level {

namespace {

struct CodeRange {
  char32_t lo, hi;
};
#include "src/data/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&table)[N], char32_t cp) {
  auto it = std::upper_bound(std::begin(table), std::end(table), cp,
                             [](char32_t c, const CodeRange& r) { return c < r.lo; });
  return it != std::begin(table) && cp <= std::prev(it)->hi;
}

// Unicode's White_Space property, which \s matches.
bool is_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace

Class classify(char32_t c) {
  if (c < 0x80) {
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return Class::letter;
    if (c >= '0' && c <= '9') return Class::number;
    return is_space(c) ? Class::space : Class::other;
  }
  if (in_ranges(kLetters, c)) return Class::letter;
  if (in_ranges(kNumbers, c)) return Class::number;
  return is_space(c) ? Class::space : Class::other;
}

std::pair<char32_t, size_t> decode_utf8(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1};
  const size_t len = b0 >= 0xC2 && b0 <= 0xDF   ? 2
                     : b0 >= 0xE0 && b0 <= 0xEF ? 3
                     : b0 >= 0xF0 && b0 <= 0xF4 ? 4
                                                : 0;
  if (len == 0 || i + len > s.size()) return {kInvalid, 1};
  char32_t cp = b0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return {kInvalid, 1};
    cp = (cp << 6) | (b & 0x3F);
  }
  constexpr char32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};  // by length: shorter is overlong
  if (cp < kLeast[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return {kInvalid, 1};
  return {cp, len};
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace byte_level

using byte_level::Class;
using byte_level::classify;
using byte_level::decode_utf8;
using byte_level::kInvalid;

std::string byte_to_unicode(uint8_t b) {
  std::string s;
  byte_level::append_utf8(s, byte_level::byte_map().to_cp[b]);
  return s;
}

std::vector<std::string_view> gpt2_split(std::string_view text) {
  std::vector<std::string_view> out;
  const size_t n = text.size();
  auto cls_at = [&](size_t i) {
    const char32_t c = decode_utf8(text, i).first;
    return c == kInvalid ? Class::other : classify(c);
  };
  auto next = [&](size_t i) { return i + decode_utf8(text, i).second; };
  size_t pos = 0;
  while (pos < n) {
    const size_t start = pos;
    // 's 't 're 've 'm 'll 'd
    if (text[pos] == '\'') {
      size_t len = 0;
      for (std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"})
        if (text.substr(pos + 1, suffix.size()) == suffix) {
          len = 1 + suffix.size();
          break;
        }
      if (len > 0) {
        out.push_back(text.substr(start, len));
        pos += len;
        continue;
      }
    }
    // ' ?' then a run of letters, numbers or others
    size_t p = pos;
    Class cls = cls_at(pos);
    if (text[pos] == ' ' && pos + 1 < n && cls_at(pos + 1) != Class::space) {
      p = pos + 1;
      cls = cls_at(p);
    }
    if (cls != Class::space) {
      while (p < n && cls_at(p) == cls) p = next(p);
      out.push_back(text.substr(start, p - start));
      pos = p;
      continue;
    }
    // whitespace: the run, less its last code point when a non-space follows (\s+(?!\S)),
    // or that one code point alone (\s+)
    size_t last = pos;
    p = pos;
    while (p < n && cls_at(p) == Class::space) {
      last = p;
      p = next(p);
    }
    if (p < n && last > pos) p = last;
    out.push_back(text.substr(start, p - start));
    pos = p;
  }
  return out;
}

}  // namespace fsdp::data
