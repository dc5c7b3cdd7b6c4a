// The Jinja engine's tokens: the lexer (jinja_lex.cpp) turns a template into text, tag
// delimiters and expression tokens, with Jinja2's whitespace control already applied.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::data::jinja {

struct Tok {
  enum K : uint8_t { text, var_begin, var_end, block_begin, block_end, name, str, integer, floating, op, eof };
  K k;
  std::string v;
  int line;
};

// Throws, naming `name` and the line, on an unclosed tag, comment, string or raw block.
std::vector<Tok> lex_template(const std::string& source, const std::string& name);

}  // namespace fsdp::data::jinja
