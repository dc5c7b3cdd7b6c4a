// The Jinja engine's expressions: names, literals, attribute and item access (Jinja2's: a missing
// key, index or attribute is Undefined; only an Undefined's attribute is an error), calls, and
// Python's operators with Python's types (int and float, str and list concatenation, // and %
// rounding toward minus infinity). Strings index and slice by code point, as Python's do.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "jinja_impl.h"

namespace fsdp::data::jinja {

namespace {

bool is_int(const Value& v) { return v.t == Value::T::integer || v.t == Value::T::boolean; }
int64_t as_int(const Value& v) { return v.t == Value::T::integer ? v.i : int64_t(v.b); }

int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// Python's item access: a dict's key, a list's or string's index (negative from the end).
Value item(Evaluator& ev, const Value& obj, const Value& key, int line, const std::string& what) {
  if (obj.is_undefined()) ev.fail(line, fmt::format("'{}' is undefined (its {} was read)", obj.s, what));
  if (obj.t == Value::T::dict) {
    if (auto k = dict_key(key))
      if (const Value* v = obj.d->find(*k)) return *v;
    return Value::undefined(what);
  }
  if (obj.t == Value::T::list && obj.seq != Value::Seq::plain) return Value::undefined(what);
  if ((obj.t == Value::T::list || obj.t == Value::T::string) && is_int(key)) {
    int64_t i = as_int(key);
    if (obj.t == Value::T::list) {
      int64_t n = int64_t(obj.l->size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(what);
      return (*obj.l)[size_t(i)];
    }
    auto cps = code_points(obj.s);
    int64_t n = int64_t(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(what);
    return Value::string(utf8(cps, size_t(i), size_t(i) + 1));
  }
  return Value::undefined(what);
}

Value slice(Evaluator& ev, const Value& obj, const Value* parts[3], int line) {
  int64_t n;
  std::vector<uint32_t> cps;
  if (obj.t == Value::T::list && obj.seq == Value::Seq::plain) n = int64_t(obj.l->size());
  else if (obj.t == Value::T::string) cps = code_points(obj.s), n = int64_t(cps.size());
  else ev.fail(line, fmt::format("a {} cannot be sliced", type_name(obj)));
  int64_t step = 1;
  if (parts[2] && parts[2]->t != Value::T::none) {
    if (!is_int(*parts[2]) || as_int(*parts[2]) == 0) ev.fail(line, "a slice's step must be a nonzero integer");
    step = as_int(*parts[2]);
  }
  auto bound = [&](const Value* v, int64_t dflt) {
    if (!v || v->t == Value::T::none) return dflt;
    if (!is_int(*v)) ev.fail(line, "slice indices must be integers or None");
    int64_t x = as_int(*v);
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t start = bound(parts[0], step > 0 ? 0 : n - 1), stop = bound(parts[1], step > 0 ? n : -1);
  List l;
  std::vector<uint32_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (obj.t == Value::T::list) l.push_back((*obj.l)[size_t(i)]);
    else out.push_back(cps[size_t(i)]);
  }
  if (obj.t == Value::T::string) return Value::string(utf8(out, 0, out.size()));
  Value v = Value::list(std::move(l));
  v.tuple = obj.tuple;
  return v;
}

int compare_values(Evaluator& ev, const Value& a, const Value& b, const std::string& op, int line) {
  if (a.is_number() && b.is_number()) {
    if (a.t == Value::T::floating || b.t == Value::T::floating) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b) ? 1 : 0;
  }
  if (a.t == Value::T::string && b.t == Value::T::string) return a.s.compare(b.s) < 0 ? -1 : a.s == b.s ? 0 : 1;
  if (a.t == Value::T::list && b.t == Value::T::list && a.tuple == b.tuple) {
    for (size_t i = 0; i < a.l->size() && i < b.l->size(); ++i)
      if (!equal((*a.l)[i], (*b.l)[i])) return compare_values(ev, (*a.l)[i], (*b.l)[i], op, line);
    return a.l->size() < b.l->size() ? -1 : a.l->size() > b.l->size() ? 1 : 0;
  }
  ev.fail(line, fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b)));
}

bool contains(Evaluator& ev, const Value& hay, const Value& needle, int line) {
  switch (hay.t) {
    case Value::T::undefined: return false;
    case Value::T::string:
      if (needle.t != Value::T::string)
        ev.fail(line, fmt::format("'in <string>' requires string as left operand, not {}", type_name(needle)));
      return hay.s.find(needle.s) != std::string::npos;
    case Value::T::list:
      for (const auto& x : *hay.l)
        if (equal(x, needle)) return true;
      return false;
    case Value::T::dict: {
      auto k = dict_key(needle);
      return k && hay.d->find(*k);
    }
    default: ev.fail(line, fmt::format("argument of type '{}' is not iterable", type_name(hay)));
  }
}

Value arith(Evaluator& ev, const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") {
    if (a.t == Value::T::string && b.t == Value::T::string) ev.check_size(a.s.size() + b.s.size(), line);
    std::string s = to_str(a) + to_str(b);
    ev.check_size(s.size(), line);
    return Value::string(std::move(s));
  }
  if (a.is_undefined() || b.is_undefined())
    ev.fail(line, fmt::format("'{}' is undefined (used with '{}')", a.is_undefined() ? a.s : b.s, op));
  auto bad = [&]() -> Value {
    ev.fail(line, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
  };
  if (a.is_number() && b.is_number()) {
    bool fl = a.t == Value::T::floating || b.t == Value::T::floating;
    if (op == "/") {
      if (b.as_double() == 0) ev.fail(line, "division by zero");
      return Value::floating(a.as_double() / b.as_double());
    }
    if (fl) {
      double x = a.as_double(), y = b.as_double();
      if (op == "+") return Value::floating(x + y);
      if (op == "-") return Value::floating(x - y);
      if (op == "*") return Value::floating(x * y);
      if (op == "**") return Value::floating(std::pow(x, y));
      if (y == 0) ev.fail(line, "float division by zero");
      if (op == "//") return Value::floating(std::floor(x / y));
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::floating(m);
    }
    int64_t x = as_int(a), y = as_int(b), r = 0;
    auto overflow = [&]() -> Value {
      ev.fail(line, fmt::format("{} {} {} overflows 64 bits (Python's integers would not; refused)", x, op, y));
    };
    if (op == "+") return __builtin_add_overflow(x, y, &r) ? overflow() : Value::integer(r);
    if (op == "-") return __builtin_sub_overflow(x, y, &r) ? overflow() : Value::integer(r);
    if (op == "*") return __builtin_mul_overflow(x, y, &r) ? overflow() : Value::integer(r);
    if (op == "**") {
      if (y < 0) return Value::floating(std::pow(double(x), double(y)));
      r = 1;
      for (int64_t k = 0; k < y; ++k) {
        if (__builtin_mul_overflow(r, x, &r)) return overflow();
        if (r == 0 || r == 1) break;
      }
      if (r == 1 && x == -1) r = y % 2 ? -1 : 1;
      return Value::integer(r);
    }
    if (y == 0) ev.fail(line, "integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) return overflow();
    if (op == "//") return Value::integer(floordiv(x, y));
    return Value::integer(x - floordiv(x, y) * y);
  }
  if (op == "+" && a.t == b.t && a.t == Value::T::string) {
    ev.check_size(a.s.size() + b.s.size(), line);
    if (a.markup || b.markup) {  // Markup + str escapes the str
      Value r = Value::string((a.markup ? a.s : html_escape(a.s)) + (b.markup ? b.s : html_escape(b.s)));
      r.markup = true;
      return r;
    }
    return Value::string(a.s + b.s);
  }
  if (op == "+" && a.t == b.t && a.t == Value::T::list && a.tuple == b.tuple && a.seq == Value::Seq::plain &&
      b.seq == Value::Seq::plain) {
    List l = *a.l;
    l.insert(l.end(), b.l->begin(), b.l->end());
    ev.count_iterations(int64_t(l.size()), line);
    Value v = Value::list(std::move(l));
    v.tuple = a.tuple;
    return v;
  }
  if (op == "*" && (a.t == Value::T::string || a.t == Value::T::list) && is_int(b)) {
    int64_t k = std::max<int64_t>(0, as_int(b));
    if (a.t == Value::T::string) {
      if (!a.s.empty()) ev.check_size(size_t(std::min<int64_t>(k, int64_t(1) << 40)) * a.s.size(), line);
      std::string s;
      for (int64_t j = 0; j < k; ++j) s += a.s;
      return Value::string(std::move(s));
    }
    ev.count_iterations(std::min<int64_t>(k, int64_t(1) << 40) * int64_t(a.l->size()), line);
    List l;
    for (int64_t j = 0; j < k; ++j) l.insert(l.end(), a.l->begin(), a.l->end());
    return Value::list(std::move(l));
  }
  if (op == "*" && is_int(a) && (b.t == Value::T::string || b.t == Value::T::list)) return arith(ev, op, b, a, line);
  if (op == "%" && a.t == Value::T::string) {
    Args args;
    if (b.t == Value::T::list && b.tuple) args.pos = *b.l;
    else args.pos.push_back(b);
    return apply_filter(ev, "format", a, args, line);
  }
  return bad();
}

}  // namespace

// A call's, a filter's or a test's arguments: e.a[1..] evaluated (e.a[0] is the callee or the
// value), the last e.kw.size() of them keywords.
Args Evaluator::eval_args(const Expr& e, const std::shared_ptr<Scope>& sc) {
  Args args;
  const size_t npos = e.a.size() - 1 - e.kw.size();
  for (size_t k = 1; k < e.a.size(); ++k) {
    Value x = eval(*e.a[k], sc);
    if (k - 1 < npos) args.pos.push_back(std::move(x));
    else args.kw.emplace_back(e.kw[k - 1 - npos], std::move(x));
  }
  return args;
}

Value Evaluator::eval(const Expr& e, const std::shared_ptr<Scope>& sc) {
  Frame frame(*this, e.line);
  switch (e.k) {
    case Expr::K::literal: return e.lit;
    case Expr::K::name: {
      if (const Value* v = sc->find(e.name)) return *v;
      return Value::undefined(e.name);
    }
    case Expr::K::list:
    case Expr::K::tuple: {
      List l;
      for (const auto& x : e.a) l.push_back(eval(*x, sc));
      const uint32_t depth = depth_of(l);
      if (depth > kMaxValueDepth) fail(e.line, fmt::format("a list nested deeper than {} levels", kMaxValueDepth));
      Value v = Value::list(std::move(l));
      v.tuple = e.k == Expr::K::tuple;
      v.depth = depth;
      return v;
    }
    case Expr::K::dict: {
      Dict d;
      for (size_t k = 0; k + 1 < e.a.size(); k += 2) {
        Value key = eval(*e.a[k], sc);
        auto dk = dict_key(key);
        if (!dk) fail(e.line, fmt::format("a dict literal's key is a {}, only strings and integers are supported", type_name(key)));
        d.set(*dk, eval(*e.a[k + 1], sc));
      }
      const uint32_t depth = depth_of(d);
      if (depth > kMaxValueDepth) fail(e.line, fmt::format("a dict nested deeper than {} levels", kMaxValueDepth));
      Value v = Value::dict(std::move(d));
      v.depth = depth;
      return v;
    }
    case Expr::K::attr: {
      Value obj = eval(*e.a[0], sc);
      return item(*this, obj, Value::string(e.name), e.line, e.name);
    }
    case Expr::K::index: {
      Value obj = eval(*e.a[0], sc);
      Value key = eval(*e.a[1], sc);
      return item(*this, obj, key, e.line, key.t == Value::T::string ? key.s : to_str(key));
    }
    case Expr::K::slice: {
      Value obj = eval(*e.a[0], sc);
      Value vals[3];
      const Value* parts[3] = {nullptr, nullptr, nullptr};
      for (int k = 0; k < 3; ++k)
        if (e.a[size_t(k) + 1]) vals[k] = eval(*e.a[size_t(k) + 1], sc), parts[k] = &vals[k];
      if (obj.is_undefined()) fail(e.line, fmt::format("'{}' is undefined (sliced)", obj.s));
      return slice(*this, obj, parts, e.line);
    }
    case Expr::K::call: {
      Args args = eval_args(e, sc);
      const Expr& f = *e.a[0];
      if (f.k == Expr::K::attr) {
        Value obj = eval(*f.a[0], sc);
        if (obj.t == Value::T::dict) {
          const Value* member = obj.d->find(f.name);
          if (member && (member->fn || member->macro)) return call(*member, args, e.line);
        }
        if (obj.is_undefined()) fail(e.line, fmt::format("'{}' is undefined (its method {} was called)", obj.s, f.name));
        return call_method(*this, obj, f.name, args, e.line);
      }
      return call(eval(f, sc), args, e.line);
    }
    case Expr::K::filter: {
      Value v = eval(*e.a[0], sc);
      Args args = eval_args(e, sc);
      return apply_filter(*this, e.name, std::move(v), args, e.line);
    }
    case Expr::K::test: {
      Value v = eval(*e.a[0], sc);
      Args args = eval_args(e, sc);
      return Value::boolean(apply_test(*this, e.name, v, args, e.line) != e.negated);
    }
    case Expr::K::neg:
    case Expr::K::pos: {
      Value v = eval(*e.a[0], sc);
      if (!v.is_number()) fail(e.line, fmt::format("bad operand type for unary {}: '{}'", e.k == Expr::K::neg ? '-' : '+', type_name(v)));
      if (e.k == Expr::K::pos) return v.t == Value::T::boolean ? Value::integer(v.b) : v;
      if (v.t == Value::T::integer && v.i == INT64_MIN) fail(e.line, "-(the smallest 64-bit integer) overflows (refused)");
      return v.t == Value::T::floating ? Value::floating(-v.f) : Value::integer(-as_int(v));
    }
    case Expr::K::not_: return Value::boolean(!truthy(eval(*e.a[0], sc)));
    case Expr::K::and_: {
      Value l = eval(*e.a[0], sc);
      return truthy(l) ? eval(*e.a[1], sc) : l;
    }
    case Expr::K::or_: {
      Value l = eval(*e.a[0], sc);
      return truthy(l) ? l : eval(*e.a[1], sc);
    }
    case Expr::K::binary: return arith(*this, e.name, eval(*e.a[0], sc), eval(*e.a[1], sc), e.line);
    case Expr::K::compare: {
      Value l = eval(*e.a[0], sc);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value r = eval(*e.a[k + 1], sc);
        const std::string& op = e.ops[k];
        bool ok;
        if (op == "==") ok = equal(l, r);
        else if (op == "!=") ok = !equal(l, r);
        else if (op == "in") ok = contains(*this, r, l, e.line);
        else if (op == "not in") ok = !contains(*this, r, l, e.line);
        else {
          if (l.is_undefined() || r.is_undefined())
            fail(e.line, fmt::format("'{}' is undefined (compared with '{}')", l.is_undefined() ? l.s : r.s, op));
          int c = compare_values(*this, l, r, op, e.line);
          ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
        }
        if (!ok) return Value::boolean(false);
        l = std::move(r);
      }
      return Value::boolean(true);
    }
    case Expr::K::cond: {
      if (truthy(eval(*e.a[0], sc))) return eval(*e.a[1], sc);
      if (e.a.size() > 2) return eval(*e.a[2], sc);
      return Value::undefined("inline if");
    }
  }
  fail(e.line, "an unknown expression");
}

}  // namespace fsdp::data::jinja
