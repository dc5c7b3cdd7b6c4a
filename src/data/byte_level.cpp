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

bool python_space(char32_t c) { return is_space(c) || (c >= 0x1C && c <= 0x1F); }

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

const char* const kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string_view> llama3_split(std::string_view text, int max_digits) {
  std::vector<std::string_view> out;
  const size_t n = text.size();
  auto cp_at = [&](size_t i) { return decode_utf8(text, i).first; };
  auto cls_at = [&](size_t i) {
    const char32_t c = cp_at(i);
    return c == kInvalid ? Class::other : classify(c);
  };
  auto next = [&](size_t i) { return i + decode_utf8(text, i).second; };
  auto is_crlf = [&](size_t i) { return text[i] == '\r' || text[i] == '\n'; };
  auto letters_from = [&](size_t p) {  // the end of the run of letters at p (p when none)
    while (p < n && cls_at(p) == Class::letter) p = next(p);
    return p;
  };
  size_t pos = 0;
  while (pos < n) {
    const size_t start = pos;
    // (?i:'s|'t|'re|'ve|'m|'ll|'d), case-insensitive (U+017F, long s, folds to s)
    if (text[pos] == '\'') {
      size_t len = 0;
      auto lower = [&](size_t i) -> std::pair<char, size_t> {
        if (i >= n) return {0, 0};
        const auto [c, l] = decode_utf8(text, i);
        if (c == 0x17F) return {'s', l};
        return {c < 0x80 ? char(c | 0x20) : char(0), l};
      };
      const auto [a, la] = lower(pos + 1);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        len = 1 + la;
      } else if (a == 'r' || a == 'v' || a == 'l') {
        const auto [b, lb] = lower(pos + 1 + la);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
          len = 1 + la + lb;
      }
      if (len > 0) {
        out.push_back(text.substr(start, len));
        pos += len;
        continue;
      }
    }
    const Class cls = cls_at(pos);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (cls == Class::letter) {
      pos = letters_from(pos);
      out.push_back(text.substr(start, pos - start));
      continue;
    }
    if (cls != Class::number && !is_crlf(pos)) {
      const size_t after = next(pos);
      if (after < n && cls_at(after) == Class::letter) {
        pos = letters_from(after);
        out.push_back(text.substr(start, pos - start));
        continue;
      }
    }
    // \p{N}{1,max_digits}
    if (cls == Class::number) {
      for (int k = 0; k < max_digits && pos < n && cls_at(pos) == Class::number; ++k)
        pos = next(pos);
      out.push_back(text.substr(start, pos - start));
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    {
      size_t p = pos;
      if (text[p] == ' ' && p + 1 < n) p = p + 1;
      if (p < n && cls_at(p) == Class::other && (p == pos || text[pos] == ' ')) {
        while (p < n && cls_at(p) == Class::other) p = next(p);
        while (p < n && is_crlf(p)) ++p;
        out.push_back(text.substr(start, p - start));
        pos = p;
        continue;
      }
    }
    // Whitespace: \s*[\r\n]+ (the run up to its last CR or LF), else \s+(?!\S) (the run, less
    // its last code point when a non-space follows), else \s+ (the run).
    size_t end = pos, last_crlf = std::string_view::npos, last = pos;
    while (end < n && cls_at(end) == Class::space) {
      if (is_crlf(end)) last_crlf = end;
      last = end;
      end = next(end);
    }
    if (end == pos) {  // not reached for valid input: every code point is one of the classes
      pos = next(pos);
      out.push_back(text.substr(start, pos - start));
      continue;
    }
    if (last_crlf != std::string_view::npos)
      pos = last_crlf + 1;
    else if (end < n && last > pos)
      pos = last;
    else
      pos = end;
    out.push_back(text.substr(start, pos - start));
  }
  return out;
}

}  // namespace fsdp::data
