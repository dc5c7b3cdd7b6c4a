// The Jinja engine's statements: if/elif/else, for (with else, and a filter), set (names, tuples,
// a namespace's attribute, a block), macro, call, filter blocks, break/continue and
// transformers' {% generation %}. Any other statement is refused by name.
#include "jinja_parse.h"

namespace fsdp::data::jinja {

// Statements until a block tag whose name is in `ends` (left in `end`, its name consumed).
std::vector<Node> Parser::body(const std::set<std::string>& ends, std::string& end) {
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

Node Parser::statement(const std::string& w, int line) {
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

void Parser::params(Node& n) {
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

void parse_template(const std::string& source, Program& out) {
  Parser ps(lex_template(source, out.name), out);
  ps.run();
}

}  // namespace fsdp::data::jinja
