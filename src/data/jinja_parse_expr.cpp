// The Jinja engine's expressions, by Jinja2's precedence: inline if, or, and, not, comparisons
// (chained, in, not in), + -, ~, * / // %, **, unary - +, then postfix access (.name, [i],
// [a:b:c], calls) and filters (|f) and tests (is [not] t). Each level's recursion passes the
// nesting check.
#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja_parse.h"

namespace fsdp::data::jinja {

ExprP Parser::make(Expr::K k, int line) {
  auto e = std::make_unique<Expr>();
  e->k = k;
  e->line = line;
  return e;
}

// set's value: "a, b" is a tuple.
ExprP Parser::tuple_expr() {
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

ExprP Parser::expression() {
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
ExprP Parser::or_expr(bool no_cond) {
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
ExprP Parser::and_expr(bool no_cond) {
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
ExprP Parser::not_expr(bool no_cond) {
  if (is_name("not")) {
    Deeper d(*this);
    auto e = make(Expr::K::not_, cur().line);
    ++i_;
    e->a.push_back(not_expr(no_cond));
    return e;
  }
  return compare(no_cond);
}
ExprP Parser::compare(bool no_cond) {
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
ExprP Parser::binary(ExprP l, const std::string& op, ExprP r, int line) {
  auto e = make(Expr::K::binary, line);
  e->name = op;
  e->a.push_back(std::move(l));
  e->a.push_back(std::move(r));
  return e;
}
ExprP Parser::math1(bool nc) {
  ExprP l = concat(nc);
  while (is_op("+") || is_op("-")) {
    std::string op = cur().v;
    int line = cur().line;
    ++i_;
    l = binary(std::move(l), op, concat(nc), line);
  }
  return l;
}
ExprP Parser::concat(bool nc) {
  ExprP l = math2(nc);
  while (is_op("~")) {
    int line = cur().line;
    ++i_;
    l = binary(std::move(l), "~", math2(nc), line);
  }
  return l;
}
ExprP Parser::math2(bool nc) {
  ExprP l = power(nc);
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    std::string op = cur().v;
    int line = cur().line;
    ++i_;
    l = binary(std::move(l), op, power(nc), line);
  }
  return l;
}
ExprP Parser::power(bool nc) {
  ExprP l = unary(nc, true);
  while (is_op("**")) {
    int line = cur().line;
    ++i_;
    l = binary(std::move(l), "**", unary(nc, true), line);
  }
  return l;
}
ExprP Parser::unary(bool nc, bool with_filter) {
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
ExprP Parser::primary() {
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
ExprP Parser::postfix(ExprP e) {
  while (true) {
    int line = cur().line;
    if (is_op(".")) {
      ++i_;
      auto a = make(Expr::K::attr, line);
      if (cur().k == Tok::integer) {  // x.0 is x[0]
        a->k = Expr::K::index;
        a->a.push_back(std::move(e));
        auto lit = make(Expr::K::literal, line);
        if (t_[i_].v.size() > 18) fail(fmt::format("the index {} is out of range", t_[i_].v));
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
ExprP Parser::subscript(ExprP obj, int line) {
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
void Parser::arguments(Expr& e) {
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
ExprP Parser::call(ExprP callee) {
  auto e = make(Expr::K::call, cur().line);
  e->a.push_back(std::move(callee));
  arguments(*e);
  return e;
}
ExprP Parser::filters(ExprP e, bool nc) {
  while (true) {
    int line = cur().line;
    if (is_op("|")) {
      ++i_;
      auto f = make(Expr::K::filter, line);
      f->name = expect_name();
      while (is_op(".")) {
        ++i_;
        f->name += '.';
    f->name += expect_name();
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
        t->name += '.';
    t->name += expect_name();
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

}  // namespace fsdp::data::jinja
