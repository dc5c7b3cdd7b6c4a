// The Jinja engine's parser: tokens (jinja_lex.h) to the syntax tree of jinja_impl.h. Statements
// are parsed in jinja_parse.cpp, expressions (with Jinja2's operator precedence) in
// jinja_parse_expr.cpp. The parser recurses over the template's nesting, so it refuses nesting
// deeper than kMaxNesting by name rather than exhaust the stack.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "jinja_impl.h"
#include "jinja_lex.h"

namespace fsdp::data::jinja {

constexpr int kMaxNesting = 100;
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


  std::vector<Node> body(const std::set<std::string>& ends, std::string& end);
  Node statement(const std::string& w, int line);
  void params(Node& n);
  ExprP make(Expr::K k, int line);
  ExprP tuple_expr();
  ExprP expression();
  ExprP or_expr(bool no_cond);
  ExprP and_expr(bool no_cond);
  ExprP not_expr(bool no_cond);
  ExprP compare(bool no_cond);
  ExprP binary(ExprP l, const std::string& op, ExprP r, int line);
  ExprP math1(bool nc);
  ExprP concat(bool nc);
  ExprP math2(bool nc);
  ExprP power(bool nc);
  ExprP unary(bool nc, bool with_filter);
  ExprP primary();
  ExprP postfix(ExprP e);
  ExprP subscript(ExprP obj, int line);
  void arguments(Expr& e);
  ExprP call(ExprP callee);
  ExprP filters(ExprP e, bool nc);
};

}  // namespace fsdp::data::jinja
