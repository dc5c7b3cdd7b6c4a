// The Jinja engine's lexer. Whitespace is handled as Jinja2's lexer does with trim_blocks and
// lstrip_blocks (transformers' settings): a block or comment tag eats the one newline after it,
// and the spaces before it on its line; "-" strips all whitespace on that side, "+" keeps it. The
// source's newlines are normalized to \n and one trailing newline dropped, as Jinja2 does.
#include <fmt/format.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <utility>

#include "fsdp/core/error.h"
#include "jinja_lex.h"
#include "src/data/byte_level.h"

namespace fsdp::data::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name) : name_(name) {
    // Jinja2 splits on \r\n, \r, \n and joins with \n, dropping one trailing newline.
    s_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        s_ += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        s_ += src[i];
      }
    }
    if (!s_.empty() && s_.back() == '\n') s_.pop_back();
  }

  std::vector<Tok> run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      size_t open = find_open(pos_);
      std::string text = s_.substr(pos_, open - pos_);
      if (open == s_.size()) {
        emit(Tok::text, text);
        break;
      }
      char kind = s_[open + 1];
      size_t after = open + 2;
      char sign = after < s_.size() && (s_[after] == '-' || s_[after] == '+') ? s_[after] : 0;
      if (sign) ++after;
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && is_space(text[e - 1])) --e;
        text.resize(e);
      } else if (sign != '+' && kind != '{') {
        size_t l = text.rfind('\n');
        size_t lpos = l == std::string::npos ? 0 : l + 1;
        if ((lpos > 0 || line_starting) && lpos < text.size()) {
          bool ws = true;
          for (size_t i = lpos; i < text.size(); ++i) ws = ws && is_space(text[i]);
          if (ws) text.resize(lpos);
        }
      }
      emit(Tok::text, text);
      count_lines(pos_, open);
      pos_ = after;
      if (kind == '#') {
        size_t end = s_.find("#}", pos_);
        if (end == std::string::npos) fail("the comment is not closed");
        bool minus = end > pos_ && s_[end - 1] == '-', plus = end > pos_ && s_[end - 1] == '+';
        count_lines(pos_, end);
        pos_ = end + 2;
        line_starting = finish_tag(minus, plus, true);
      } else if (kind == '%' && is_raw()) {
        line_starting = lex_raw();
      } else {
        emit(kind == '%' ? Tok::block_begin : Tok::var_begin, "");
        line_starting = lex_tag(kind == '%');
      }
    }
    emit(Tok::eof, "");
    return std::move(toks_);
  }

 private:
  std::string s_;
  const std::string& name_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Tok> toks_;

  [[noreturn]] void fail(const std::string& what) const {
    FSDP_FAIL("[jinja] {}:{}: {}", name_, line_, what);
  }
  void emit(Tok::K k, std::string v) {
    if (k == Tok::text && v.empty()) return;
    toks_.push_back({k, std::move(v), line_});
  }
  void count_lines(size_t a, size_t b) {
    for (size_t i = a; i < b && i < s_.size(); ++i) line_ += s_[i] == '\n';
  }
  size_t find_open(size_t from) const {
    for (size_t i = from; i + 1 < s_.size(); ++i)
      if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    return s_.size();
  }
  // After a tag's closing "%}"/"#}": "-" eats the whitespace after, else trim_blocks eats one
  // newline. Returns whether what the tag's match consumed ended with a newline (lstrip's
  // "line starting" for the next text).
  bool finish_tag(bool minus, bool plus, bool block) {
    size_t start = pos_;
    if (minus) {
      while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
    } else if (!plus && block && pos_ < s_.size() && s_[pos_] == '\n') {
      ++pos_;
    }
    count_lines(start, pos_);
    return pos_ > start && s_[pos_ - 1] == '\n';
  }
  size_t skip_ws(size_t i) const {
    while (i < s_.size() && is_space(s_[i])) ++i;
    return i;
  }
  bool word_at(size_t i, const char* w) const {
    size_t n = std::strlen(w);
    if (s_.compare(i, n, w) != 0) return false;
    return i + n >= s_.size() || !(std::isalnum(static_cast<unsigned char>(s_[i + n])) || s_[i + n] == '_');
  }
  bool is_raw() const {
    size_t i = skip_ws(pos_);
    if (!word_at(i, "raw")) return false;
    i = skip_ws(i + 3);
    return s_.compare(i, 2, "%}") == 0 || s_.compare(i, 3, "-%}") == 0;
  }
  bool lex_raw() {
    size_t i = skip_ws(pos_) + 3;
    i = skip_ws(i);
    bool minus = s_[i] == '-';
    count_lines(pos_, i);
    pos_ = i + (minus ? 3 : 2);
    size_t start = pos_;
    if (minus) pos_ = skip_ws(pos_);
    else if (pos_ < s_.size() && s_[pos_] == '\n') ++pos_;
    count_lines(start, pos_);
    for (size_t j = pos_; j + 1 < s_.size(); ++j) {
      if (s_[j] != '{' || s_[j + 1] != '%') continue;
      size_t k = j + 2;
      char sign = k < s_.size() && (s_[k] == '-' || s_[k] == '+') ? s_[k] : 0;
      if (sign) ++k;
      k = skip_ws(k);
      if (!word_at(k, "endraw")) continue;
      k = skip_ws(k + 6);
      bool m = s_.compare(k, 3, "-%}") == 0, p = s_.compare(k, 3, "+%}") == 0;
      if (!m && !p && s_.compare(k, 2, "%}") != 0) continue;
      std::string text = s_.substr(pos_, j - pos_);
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      }
      emit(Tok::text, text);
      count_lines(pos_, k);
      pos_ = k + (m || p ? 3 : 2);
      return finish_tag(m, p, true);
    }
    fail("{% raw %} without {% endraw %}");
  }
  // The tokens of one {{ ... }} or {% ... %}, through its end.
  bool lex_tag(bool block) {
    int depth = 0;
    while (true) {
      size_t i = pos_;
      while (i < s_.size() && is_space(s_[i])) ++i;
      count_lines(pos_, i);
      pos_ = i;
      if (pos_ >= s_.size()) fail(block ? "a {% tag is not closed" : "a {{ tag is not closed");
      const char* end = block ? "%}" : "}}";
      if (depth == 0) {
        if (s_[pos_] == '-' && s_.compare(pos_ + 1, 2, end) == 0) {
          pos_ += 3;
          emit(block ? Tok::block_end : Tok::var_end, "");
          return finish_tag(true, false, block);
        }
        if (block && s_[pos_] == '+' && s_.compare(pos_ + 1, 2, end) == 0) {
          pos_ += 3;
          emit(Tok::block_end, "");
          return finish_tag(false, true, block);
        }
        if (s_.compare(pos_, 2, end) == 0) {
          pos_ += 2;
          emit(block ? Tok::block_end : Tok::var_end, "");
          return finish_tag(false, false, block);
        }
      }
      char c = s_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        emit(Tok::name, s_.substr(pos_, e - pos_));
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "~", "[", "]",
                                    "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";", "%"};
        const char* hit = nullptr;
        for (const char* o : ops)
          if (s_.compare(pos_, std::strlen(o), o) == 0) {
            hit = o;
            break;
          }
        if (!hit) fail(fmt::format("unexpected character '{}' in a tag", c));
        std::string o = hit;
        if (o == "(" || o == "[" || o == "{") ++depth;
        if ((o == ")" || o == "]" || o == "}") && depth > 0) --depth;
        emit(Tok::op, o);
        pos_ += o.size();
      }
    }
  }
  void lex_number() {
    size_t e = pos_;
    auto digits = [&] {
      while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
    };
    digits();
    bool fl = false;
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      ++e;
      digits();
      fl = true;
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t k = e + 1;
      if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
      if (k < s_.size() && std::isdigit(static_cast<unsigned char>(s_[k]))) {
        e = k;
        digits();
        fl = true;
      }
    }
    std::string v;
    for (size_t i = pos_; i < e; ++i)
      if (s_[i] != '_') v += s_[i];
    emit(fl ? Tok::floating : Tok::integer, v);
    pos_ = e;
  }
  static void put_utf8(std::string& o, uint32_t cp) {
    byte_level::append_utf8(o, char32_t(cp));
  }
  // A string literal, with Python's escapes (Jinja2 decodes them as "unicode-escape").
  void lex_string(char q) {
    std::string v;
    size_t i = pos_ + 1;
    int start_line = line_;
    for (; i < s_.size() && s_[i] != q; ++i) {
      if (s_[i] == '\n') ++line_;
      if (s_[i] != '\\' || i + 1 >= s_.size()) {
        v += s_[i];
        continue;
      }
      char c = s_[++i];
      auto hex = [&](int n) {
        uint32_t cp = 0;
        for (int k = 0; k < n; ++k) {
          char h = i + 1 < s_.size() ? s_[++i] : 0;
          if (!std::isxdigit(static_cast<unsigned char>(h))) fail("a malformed \\x, \\u or \\U escape in a string");
          cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 32) - 'a' + 10);
        }
        put_utf8(v, cp);
      };
      switch (c) {
        case 'n': v += '\n'; break;
        case 't': v += '\t'; break;
        case 'r': v += '\r'; break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case 'a': v += '\a'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'v': v += '\v'; break;
        case '\n': ++line_; break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (c >= '0' && c <= '7') {
            uint32_t cp = uint32_t(c - '0');
            for (int k = 0; k < 2 && i + 1 < s_.size() && s_[i + 1] >= '0' && s_[i + 1] <= '7'; ++k)
              cp = cp * 8 + uint32_t(s_[++i] - '0');
            put_utf8(v, cp);
          } else if (c == 'N') {
            fail("\\N{...} escapes in strings are not supported");
          } else {
            v += '\\';
            v += c;
          }
      }
    }
    if (i >= s_.size()) {
      line_ = start_line;
      fail("a string is not closed");
    }
    emit(Tok::str, v);
    pos_ = i + 1;
  }
};

}  // namespace

std::vector<Tok> lex_template(const std::string& source, const std::string& name) {
  return Lexer(source, name).run();
}

}  // namespace fsdp::data::jinja
