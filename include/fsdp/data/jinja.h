// A sandboxed Jinja engine for chat templates: the part of Jinja2 that published models' templates
// use, rendering as transformers' apply_chat_template does (Jinja2's ImmutableSandboxedEnvironment
// with trim_blocks and lstrip_blocks, its loopcontrols extension, transformers' tojson,
// raise_exception, strftime_now, namespace and {% generation %} blocks).
//
//   - A template sees only the JSON context it is given (messages, tools, bos_token, ...); values
//     are immutable except a namespace's attributes, as in Jinja2's immutable sandbox.
//   - An undefined name behaves as Jinja2's default Undefined: it prints as nothing, is false and
//     empty, and an attribute of it is an error.
//   - Every construct the engine does not implement is refused by name when the template is
//     parsed (or, for a filter, test or method name, when it is reached), never skipped; so is any
//     run past Limits, naming the limit, the template's name and its line.
// The decision a reader would ask about: the engine interprets a syntax tree directly rather than
// compiling, because chat templates are short and rendering one conversation is microseconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdp::data::jinja {

struct Limits {
  int64_t max_loop_iterations = 1'000'000;  // all loops of one render together
  int max_call_depth = 200;                 // macro calls inside macro calls
  size_t max_output_bytes = 8u << 20;       // the rendered text, and any one string built
  double max_seconds = 1.0;                 // wall time of one render
};

// The rendered text and the byte spans [begin, end) that {% generation %} blocks wrote, in order.
struct Rendered {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

struct Program;

class Template {
 public:
  // Parses `source`; throws, naming `name` and the line, on a syntax error, on nesting deeper than
  // the parser's fixed bound, or on a statement the engine does not support.
  explicit Template(const std::string& source, std::string name = "<template>", Limits limits = {});
  // Renders with `context`'s keys as the template's variables (a JSON object), plus the globals
  // range, dict, namespace, raise_exception and strftime_now. raise_exception's message is thrown
  // as an fsdp::Error that holds it.
  Rendered render(const nlohmann::ordered_json& context) const;
  bool has_generation_blocks() const;
  const std::string& name() const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace fsdp::data::jinja
