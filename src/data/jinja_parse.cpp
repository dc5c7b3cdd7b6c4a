// The Jinja engine's lexer and parser: template text to the syntax tree of jinja_impl.h.
// Whitespace is handled as Jinja2's lexer does with trim_blocks and lstrip_blocks (transformers'
// settings): a block or comment tag eats the one newline after it, and the spaces before it on its
// line; "-" strips all whitespace on that side, "+" keeps it. The source's newlines are normalized
// to \n and one trailing newline dropped, as Jinja2 does. The parser recurses over the template's
// nesting, so it refuses nesting deeper than kMaxNesting by name rather than exhaust the stack.
#include <fmt/format.h>

#include <cstring>
#include <set>

#include "fsdp/core/error.h"
#include "jinja_impl.h"

namespace fsdp::data::jinja {
namespace {

constexpr int kMaxNesting = 100;

struct Tok {
  enum K : uint8_t { text, var_begin, var_end, block_begin, block_end, name, str, integer, floating, op, eof };
  K k;
  std::string v;
  int line;
};

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
    if (cp < 0x80) {
      o += char(cp);
    } else if (cp < 0x800) {
      o += char(0xC0 | (cp >> 6));
      o += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      o += char(0xE0 | (cp >> 12));
      o += char(0x80 | ((cp >> 6) & 0x3F));
      o += char(0x80 | (cp & 0x3F));
    } else {
      o += char(0xF0 | (cp >> 18));
      o += char(0x80 | ((cp >> 12) & 0x3F));
      o += char(0x80 | ((cp >> 6) & 0x3F));
      o += char(0x80 | (cp & 0x3F));
    }
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

using ExprP = std::unique_ptr<Expr>;

class Parser {
 public:
  Parser(std::vector<Tok> toks, Program& p) : t_(std::move(toks)), p_(p) {}

  void run() {
    std::string end;
    p_.body = body({}, end);
    if (!end.empty()) fail(fmt::format("unexpected '{{% {} %}}'", end));
  }

 private:
  std::vector<Tok> t_;
  Program& p_;
  size_t i_ = 0;
  int depth_ = 0;

  const Tok& cur() const { return t_[i_]; }
  const Tok& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  [[noreturn]] void fail(const std::string& what) const {
    FSDP_FAIL("[jinja] {}:{}: {}", p_.name, cur().line, what);
  }
  bool is_op(const char* o) const { return cur().k == Tok::op && cur().v == o; }
  bool is_name(const char* n) const { return cur().k == Tok::name && cur().v == n; }
  void expect_op(const char* o) {
    if (!is_op(o)) fail(fmt::format("expected '{}', found '{}'", o, describe()));
    ++i_;
  }
  std::string describe() const {
    switch (cur().k) {
      case Tok::var_end: return "}}";
      case Tok::block_end: return "%}";
      case Tok::eof: return "the end of the template";
      default: return cur().v;
    }
  }
  std::string expect_name() {
    if (cur().k != Tok::name) fail(fmt::format("expected a name, found '{}'", describe()));
    return t_[i_++].v;
  }
  void expect_block_end() {
    if (cur().k != Tok::block_end) fail(fmt::format("expected '%}}', found '{}'", describe()));
    ++i_;
  }
  struct Deeper {
    Parser& p;
    explicit Deeper(Parser& q) : p(q) {
      if (++p.depth_ > kMaxNesting)
        p.fail(fmt::format("nesting deeper than {} (the parser's limit)", kMaxNesting));
    }
    ~Deeper() { --p.depth_; }
  };

  // Statements until a block tag whose name is in `ends` (left in `end`, its name consumed).
  std::vector<Node> body(const std::set<std::string>& ends, std::string& end) {
    Deeper d(*this);
    std::vector<Node> out;
    while (true) {
      const Tok& t = cur();
      if (t.k == Tok::eof) {
        if (!ends.empty()) fail(fmt::format("the template ended inside a block (expected {{% {} %}})", *ends.begin()));
        return out;
      }
      if (t.k == Tok::text) {
        out.push_back(Node{Node::K::text, t.line});
        out.back().text = t.v;
        ++i_;
      } else if (t.k == Tok::var_begin) {
        ++i_;
        Node n{Node::K::output, t.line};
        n.expr = expression();
        if (cur().k != Tok::var_end) fail(fmt::format("expected '}}}}', found '{}'", describe()));
        ++i_;
        out.push_back(std::move(n));
      } else if (t.k == Tok::block_begin) {
        ++i_;
        std::string word = expect_name();
        if (ends.count(word)) {
          end = word;
          return out;
        }
        out.push_back(statement(word, t.line));
      } else {
        fail(fmt::format("unexpected '{}'", describe()));
      }
    }
  }

  Node statement(const std::string& w, int line) {
    std::string end;
    if (w == "if") {
      Node n{Node::K::if_, line};
      n.conds.push_back(expression());
      expect_block_end();
      while (true) {
        n.bodies.push_back(body({"elif", "else", "endif"}, end));
        if (end == "elif") {
          n.conds.push_back(expression());
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          n.bodies.push_back(body({"endif"}, end));
          break;
        } else {
          break;
        }
      }
      expect_block_end();
      return n;
    }
    if (w == "for") {
      Node n{Node::K::for_, line};
      n.targets.push_back(expect_name());
      while (is_op(",")) {
        ++i_;
        n.targets.push_back(expect_name());
      }
      if (!is_name("in")) fail(fmt::format("expected 'in' in a for loop, found '{}'", describe()));
      ++i_;
      n.expr = or_expr(true);
      if (is_name("if")) {
        ++i_;
        n.cond = or_expr(true);
      }
      if (is_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end();
      n.bodies.push_back(body({"else", "endfor"}, end));
      if (end == "else") {
        expect_block_end();
        n.bodies.push_back(body({"endfor"}, end));
      }
      expect_block_end();
      return n;
    }
    if (w == "set") {
      Node n{Node::K::set, line};
      n.targets.push_back(expect_name());
      if (is_op(".")) {
        ++i_;
        n.targets.push_back(expect_name());
        n.attr_target = true;
      } else {
        while (is_op(",")) {
          ++i_;
          n.targets.push_back(expect_name());
        }
      }
      if (cur().k == Tok::block_end && n.targets.size() == 1) {
        ++i_;
        n.k = Node::K::set_block;
        n.bodies.push_back(body({"endset"}, end));
        expect_block_end();
        return n;
      }
      expect_op("=");
      n.expr = tuple_expr();
      expect_block_end();
      return n;
    }
    if (w == "macro") {
      Node n{Node::K::macro, line};
      n.text = expect_name();
      params(n);
      expect_block_end();
      n.bodies.push_back(body({"endmacro"}, end));
      if (cur().k == Tok::name) ++i_;  // {% endmacro name %}
      expect_block_end();
      return n;
    }
    if (w == "call") {
      Node n{Node::K::call_block, line};
      if (is_op("(")) params(n);
      n.expr = expression();
      if (n.expr->k != Expr::K::call) fail("{% call %} needs a macro call");
      expect_block_end();
      n.bodies.push_back(body({"endcall"}, end));
      expect_block_end();
      return n;
    }
    if (w == "filter") {
      Node n{Node::K::filter_block, line};
      n.text = expect_name();
      if (is_op("(")) fail("{% filter %} with arguments is not supported");
      expect_block_end();
      n.bodies.push_back(body({"endfilter"}, end));
      expect_block_end();
      return n;
    }
    if (w == "generation") {
      Node n{Node::K::generation, line};
      p_.has_generation = true;
      expect_block_end();
      n.bodies.push_back(body({"endgeneration"}, end));
      expect_block_end();
      return n;
    }
    if (w == "break" || w == "continue") {
      expect_block_end();
      return Node{w == "break" ? Node::K::break_ : Node::K::continue_, line};
    }
    fail(fmt::format("the statement '{{% {} %}}' is not supported", w));
  }

  void params(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      n.params.push_back(expect_name());
      if (is_op("=")) {
        ++i_;
        n.conds.push_back(expression());
      } else {
        n.conds.push_back(nullptr);
      }
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }

  ExprP make(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }

  // set's value: "a, b" is a tuple.
  ExprP tuple_expr() {
    int line = cur().line;
    ExprP first = expression();
    if (!is_op(",")) return first;
    auto t = make(Expr::K::tuple, line);
    t->a.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().k == Tok::block_end) break;
      t->a.push_back(expression());
    }
    return t;
  }

  ExprP expression() {
    Deeper d(*this);
    int line = cur().line;
    ExprP e = or_expr(false);
    if (is_name("if")) {
      ++i_;
      auto c = make(Expr::K::cond, line);
      c->a.push_back(or_expr(false));
      c->a.push_back(std::move(e));
      if (is_name("else")) {
        ++i_;
        c->a.push_back(expression());
      }
      return c;
    }
    return e;
  }
  ExprP or_expr(bool no_cond) {
    ExprP l = and_expr(no_cond);
    while (is_name("or")) {
      auto e = make(Expr::K::or_, cur().line);
      ++i_;
      e->a.push_back(std::move(l));
      e->a.push_back(and_expr(no_cond));
      l = std::move(e);
    }
    return l;
  }
  ExprP and_expr(bool no_cond) {
    ExprP l = not_expr(no_cond);
    while (is_name("and")) {
      auto e = make(Expr::K::and_, cur().line);
      ++i_;
      e->a.push_back(std::move(l));
      e->a.push_back(not_expr(no_cond));
      l = std::move(e);
    }
    return l;
  }
  ExprP not_expr(bool no_cond) {
    if (is_name("not")) {
      Deeper d(*this);
      auto e = make(Expr::K::not_, cur().line);
      ++i_;
      e->a.push_back(not_expr(no_cond));
      return e;
    }
    return compare(no_cond);
  }
  ExprP compare(bool no_cond) {
    int line = cur().line;
    ExprP first = math1(no_cond);
    std::unique_ptr<Expr> c;
    while (true) {
      std::string op;
      if (cur().k == Tok::op && (cur().v == "==" || cur().v == "!=" || cur().v == "<" || cur().v == ">" ||
                                 cur().v == "<=" || cur().v == ">=")) {
        op = cur().v;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().k == Tok::name && peek().v == "in") {
        op = "not in";
        i_ += 2;
      } else {
        break;
      }
      if (!c) {
        c = make(Expr::K::compare, line);
        c->a.push_back(std::move(first));
      }
      c->ops.push_back(op);
      c->a.push_back(math1(no_cond));
    }
    return c ? std::move(c) : std::move(first);
  }
  ExprP binary(ExprP l, const std::string& op, ExprP r, int line) {
    auto e = make(Expr::K::binary, line);
    e->name = op;
    e->a.push_back(std::move(l));
    e->a.push_back(std::move(r));
    return e;
  }
  ExprP math1(bool nc) {
    ExprP l = concat(nc);
    while (is_op("+") || is_op("-")) {
      std::string op = cur().v;
      int line = cur().line;
      ++i_;
      l = binary(std::move(l), op, concat(nc), line);
    }
    return l;
  }
  ExprP concat(bool nc) {
    ExprP l = math2(nc);
    while (is_op("~")) {
      int line = cur().line;
      ++i_;
      l = binary(std::move(l), "~", math2(nc), line);
    }
    return l;
  }
  ExprP math2(bool nc) {
    ExprP l = power(nc);
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().v;
      int line = cur().line;
      ++i_;
      l = binary(std::move(l), op, power(nc), line);
    }
    return l;
  }
  ExprP power(bool nc) {
    ExprP l = unary(nc, true);
    while (is_op("**")) {
      int line = cur().line;
      ++i_;
      l = binary(std::move(l), "**", unary(nc, true), line);
    }
    return l;
  }
  ExprP unary(bool nc, bool with_filter) {
    Deeper d(*this);
    int line = cur().line;
    ExprP e;
    if (is_op("-") || is_op("+")) {
      bool neg = cur().v == "-";
      ++i_;
      e = make(neg ? Expr::K::neg : Expr::K::pos, line);
      e->a.push_back(unary(nc, false));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filters(std::move(e), nc);
    return e;
  }
  ExprP primary() {
    const Tok& t = cur();
    int line = t.line;
    if (t.k == Tok::name) {
      ++i_;
      auto e = make(Expr::K::literal, line);
      if (t.v == "true" || t.v == "True") e->lit = Value::boolean(true);
      else if (t.v == "false" || t.v == "False") e->lit = Value::boolean(false);
      else if (t.v == "none" || t.v == "None") e->lit = Value::none();
      else {
        e->k = Expr::K::name;
        e->name = t.v;
      }
      return e;
    }
    if (t.k == Tok::str) {
      auto e = make(Expr::K::literal, line);
      std::string v;
      while (cur().k == Tok::str) v += t_[i_++].v;  // adjacent literals concatenate
      e->lit = Value::string(std::move(v));
      return e;
    }
    if (t.k == Tok::integer || t.k == Tok::floating) {
      ++i_;
      auto e = make(Expr::K::literal, line);
      try {
        e->lit = t.k == Tok::integer ? Value::integer(std::stoll(t.v)) : Value::floating(std::stod(t.v));
      } catch (const std::exception&) {
        fail(fmt::format("the number {} is out of range", t.v));
      }
      return e;
    }
    if (is_op("(")) {
      ++i_;
      if (is_op(")")) {
        ++i_;
        return make(Expr::K::tuple, line);
      }
      ExprP first = expression();
      if (is_op(")")) {
        ++i_;
        return first;
      }
      auto e = make(Expr::K::tuple, line);
      e->a.push_back(std::move(first));
      while (is_op(",")) {
        ++i_;
        if (is_op(")")) break;
        e->a.push_back(expression());
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++i_;
      auto e = make(Expr::K::list, line);
      while (!is_op("]")) {
        e->a.push_back(expression());
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      ++i_;
      auto e = make(Expr::K::dict, line);
      while (!is_op("}")) {
        e->a.push_back(expression());
        expect_op(":");
        e->a.push_back(expression());
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op("}");
      return e;
    }
    fail(fmt::format("unexpected '{}' in an expression", describe()));
  }
  ExprP postfix(ExprP e) {
    while (true) {
      int line = cur().line;
      if (is_op(".")) {
        ++i_;
        auto a = make(Expr::K::attr, line);
        if (cur().k == Tok::integer) {  // x.0 is x[0]
          a->k = Expr::K::index;
          a->a.push_back(std::move(e));
          auto lit = make(Expr::K::literal, line);
          lit->lit = Value::integer(std::stoll(t_[i_++].v));
          a->a.push_back(std::move(lit));
        } else {
          a->name = expect_name();
          a->a.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (is_op("[")) {
        ++i_;
        e = subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }
  ExprP subscript(ExprP obj, int line) {
    ExprP parts[3];
    int n = 0;
    bool slice = false;
    while (true) {
      if (is_op(":")) {
        slice = true;
        ++i_;
        ++n;
        if (n > 2) fail("a slice has at most three parts");
        continue;
      }
      if (is_op("]")) break;
      if (parts[n]) fail("expected ':' or ']' in a subscript");
      parts[n] = expression();
    }
    expect_op("]");
    auto e = make(slice ? Expr::K::slice : Expr::K::index, line);
    e->a.push_back(std::move(obj));
    if (!slice) {
      if (!parts[0]) fail("an empty subscript");
      e->a.push_back(std::move(parts[0]));
    } else {
      for (auto& p : parts) e->a.push_back(std::move(p));
    }
    return e;
  }
  // Arguments "(a, b, k=v)" into e->a and e->kw.
  void arguments(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().k == Tok::name && peek().k == Tok::op && peek().v == "=") {
        e.kw.push_back(t_[i_].v);
        i_ += 2;
        e.a.push_back(expression());
      } else {
        if (!e.kw.empty()) fail("a positional argument after a keyword argument");
        e.a.push_back(expression());
      }
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }
  ExprP call(ExprP callee) {
    auto e = make(Expr::K::call, cur().line);
    e->a.push_back(std::move(callee));
    arguments(*e);
    return e;
  }
  ExprP filters(ExprP e, bool nc) {
    while (true) {
      int line = cur().line;
      if (is_op("|")) {
        ++i_;
        auto f = make(Expr::K::filter, line);
        f->name = expect_name();
        while (is_op(".")) {
          ++i_;
          f->name += "." + expect_name();
        }
        f->a.push_back(std::move(e));
        if (is_op("(")) arguments(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++i_;
        auto t = make(Expr::K::test, line);
        if (is_name("not")) {
          t->negated = true;
          ++i_;
        }
        t->name = expect_name();
        while (is_op(".")) {
          ++i_;
          t->name += "." + expect_name();
        }
        t->a.push_back(std::move(e));
        if (is_op("(")) {
          arguments(*t);
        } else if ((cur().k == Tok::name || cur().k == Tok::str || cur().k == Tok::integer ||
                    cur().k == Tok::floating || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("'is' after a test");
          ExprP arg = primary();
          t->a.push_back(postfix(std::move(arg)));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        (void)nc;
        return e;
      }
    }
  }
};

}  // namespace

void parse_template(const std::string& source, Program& out) {
  Lexer lx(source, out.name);
  Parser ps(lx.run(), out);
  ps.run();
}

}  // namespace fsdp::data::jinja
