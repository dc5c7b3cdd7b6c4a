// The Jinja engine's insides, shared by its three files: the values a template computes with
// (Value), the syntax tree the parser builds (Expr, Node, Program) and the builtins' entry points.
// jinja_parse.cpp lexes and parses, jinja_eval.cpp walks the tree, jinja_builtins.cpp holds the
// filters, tests and methods. A Value's list and dict are shared, never copied, since templates
// cannot change them (Jinja2's immutable sandbox); only a namespace's attributes change.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/data/jinja.h"

namespace fsdp::data::jinja {

struct Value;
struct Expr;
struct Node;
class Evaluator;
using List = std::vector<Value>;
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(size_t i, std::string_view name) const;  // positional i or keyword name
};
using Builtin = std::function<Value(Evaluator&, Args&, int line)>;
struct Macro;

struct Value {
  enum class T : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, func };
  T t = T::undefined;
  bool tuple = false;  // a list written (a, b): prints as a tuple
  // What Python would hold instead of a list: a generator (map, select, ...: truthy even when
  // empty, no len(), read once) or a dict's items(), keys() or values() view.
  enum class Seq : uint8_t { plain, generator, items, keys, values };
  Seq seq = Seq::plain;
  bool markup = false;  // a string marked safe (|safe, |e): Python's Markup, which escapes what is added to it
  uint32_t depth = 0;   // a list's or dict's nesting (kMaxValueDepth at most), so walks over values stay shallow
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // a string's bytes, or an undefined value's name
  std::shared_ptr<List> l;
  std::shared_ptr<Dict> d;
  std::shared_ptr<const Builtin> fn;
  std::shared_ptr<const Macro> macro;

  static Value none() { return with(T::none); }
  static Value boolean(bool v) { Value x = with(T::boolean); x.b = v; return x; }
  static Value integer(int64_t v) { Value x = with(T::integer); x.i = v; return x; }
  static Value floating(double v) { Value x = with(T::floating); x.f = v; return x; }
  static Value string(std::string v) { Value x = with(T::string); x.s = std::move(v); return x; }
  static Value list(List v = {});  // its depth computed
  static Value dict(Dict v = {});
  static Value undefined(std::string name) { Value x; x.s = std::move(name); return x; }
  static Value with(T t) { Value x; x.t = t; return x; }
  bool is_undefined() const { return t == T::undefined; }
  bool is_number() const { return t == T::integer || t == T::floating || t == T::boolean; }
  double as_double() const { return t == T::floating ? f : t == T::integer ? double(i) : double(b); }
};

// A dict's key: a string as is, an integer as "\0" and its digits (Python's dicts take both);
// none for another type.
std::optional<std::string> dict_key(const Value& v);
Value key_value(const std::string& key);
// Lists and dicts nest at most this deep (a template that builds deeper ones is refused), so that
// printing, comparing and freeing a value recurse a bounded depth.
constexpr int kMaxValueDepth = 200;
uint32_t depth_of(const List& l);  // 1 + the deepest item's depth
uint32_t depth_of(const Dict& d);
Value from_json(const nlohmann::ordered_json& j, int depth = 0);
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
std::string type_name(const Value& v);
std::string to_str(const Value& v);   // Python's str()
std::string repr(const Value& v);     // Python's repr()
std::string to_json(const Value& v, int indent, bool sort_keys, bool ascii, std::string_view item_sep,
                    std::string_view key_sep, int depth = 0);
std::string format_float(double f);
std::string html_escape(const std::string& s);  // markupsafe's escape  // Python's repr of a float
std::vector<uint32_t> code_points(std::string_view s);
std::string utf8(const std::vector<uint32_t>& cps, size_t begin, size_t end);
size_t code_point_count(std::string_view s);

struct Expr {
  enum class K : uint8_t {
    literal, name, list, tuple, dict, attr, index, slice, call, filter, test, neg, pos, not_, and_,
    or_, binary, compare, cond
  };
  K k;
  int line = 0;
  std::string name;               // name, attr, filter, test, binary/compare op, call kw names
  Value lit;
  std::vector<std::unique_ptr<Expr>> a;  // operands; slice: obj, start, stop, step (null: none)
  std::vector<std::string> kw;    // keyword names of the last kw.size() arguments in a
  std::vector<std::string> ops;   // compare: the operators between a[i] and a[i+1]
  bool negated = false;           // test: "is not"
};

struct Node {
  enum class K : uint8_t {
    text, output, if_, for_, set, set_block, macro, call_block, filter_block, break_, continue_,
    generation
  };
  Node(K kind, int at) : k(kind), line(at) {}
  K k;
  int line = 0;
  std::string text;                  // text; set_block, macro: the name; filter_block: filter
  std::vector<std::string> targets;  // for/set: names; set "ns.attr": {"ns", "attr"}, attr set
  bool attr_target = false;
  std::unique_ptr<Expr> expr;        // output, for's iterable, set's value, call_block's call
  std::unique_ptr<Expr> cond;        // for's "if"
  std::vector<std::unique_ptr<Expr>> conds;  // if/elif conditions; macro/call: defaults (or null)
  std::vector<std::string> params;           // macro/call_block parameters
  std::vector<std::vector<Node>> bodies;     // if: one per branch (+ else); for: body, else
};

struct Macro {
  const Node* node;
  std::shared_ptr<struct Scope> closure;
};

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* find(std::string_view n) const {
    for (const Scope* s = this; s; s = s->parent.get())
      for (const auto& [k, v] : s->vars)
        if (k == n) return &v;
    return nullptr;
  }
  void set(const std::string& n, Value v) {
    for (auto& [k, old] : vars)
      if (k == n) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(n, std::move(v));
  }
};

struct Program {
  std::string name;
  Limits limits;
  std::vector<Node> body;
  bool has_generation = false;
};

// jinja_parse.cpp
void parse_template(const std::string& source, Program& out);

// jinja_builtins.cpp: each throws, naming the filter/test/method, for one it does not know.
Value apply_filter(Evaluator& ev, const std::string& name, Value v, Args& args, int line);
bool apply_test(Evaluator& ev, const std::string& name, const Value& v, Args& args, int line);
Value call_method(Evaluator& ev, const Value& obj, const std::string& name, Args& args, int line);

// jinja_eval.cpp, for the builtins
class Evaluator {
 public:
  Evaluator(const Program& p, const nlohmann::ordered_json& ctx);
  Rendered run();
  [[noreturn]] void fail(int line, const std::string& what) const;
  void check_size(size_t bytes, int line) const;
  void count_iterations(int64_t n, int line);
  Value call(const Value& callee, Args& args, int line);

 private:
  friend struct Runner;
  const Program& p_;
  std::shared_ptr<struct Scope> globals_;
  int64_t iterations_ = 0;
  int depth_ = 0;
  int frames_ = 0;  // statements and expressions being evaluated, one inside another
  double deadline_ = 0;
  std::string out_;
  std::vector<std::pair<size_t, size_t>> spans_;
  void exec(const std::vector<Node>& body, const std::shared_ptr<Scope>& sc, std::string& out);
  void exec_node(const Node& n, const std::shared_ptr<Scope>& sc, std::string& out);
  Value eval(const Expr& e, const std::shared_ptr<Scope>& sc);
  Args eval_args(const Expr& e, const std::shared_ptr<Scope>& sc);
  Value call_macro(const Macro& m, Args& args, const std::shared_ptr<Scope>& caller_body, int line);
  void tick(int line);
  struct Frame {
    Evaluator& ev;
    Frame(Evaluator& e, int line) : ev(e) {
      if (++ev.frames_ > kMaxFrames) {
        --ev.frames_;
        ev.fail(line, fmt::format("over the recursion limit ({} nested statements and expressions)", kMaxFrames));
      }
    }
    ~Frame() { --ev.frames_; }
  };
  static constexpr int kMaxFrames = 3000;
};

}  // namespace fsdp::data::jinja
