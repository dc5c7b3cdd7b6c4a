// The Jinja engine's filters and tests, as Jinja2 3.1 defines them (transformers' tojson replaces
// Jinja2's: json.dumps with ensure_ascii=False and no HTML escaping). A name not here is refused
// by name where the template reaches it, as Jinja2 refuses an unknown filter or test. Strings are
// UTF-8; whitespace is Python's (str.split() and str.strip() also cut at U+00A0, U+3000, ...).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <compare>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "jinja_impl.h"
#include "jinja_strings.h"

namespace fsdp::data::jinja {
namespace {

Value generator(List l) {
  Value v = Value::list(std::move(l));
  v.seq = Value::Seq::generator;
  return v;
}

int64_t int_arg(Evaluator& ev, const Args& a, size_t i, const char* name, int64_t dflt, int line) {
  const Value* v = a.get(i, name);
  if (!v || v->t == Value::T::none) return dflt;
  if (v->t == Value::T::integer) return v->i;
  if (v->t == Value::T::boolean) return v->b;
  ev.fail(line, fmt::format("the argument {} must be an integer, got {}", name, type_name(*v)));
}

std::string str_arg(Evaluator& ev, const Args& a, size_t i, const char* name, const char* dflt, int line) {
  const Value* v = a.get(i, name);
  if (!v) {
    if (!dflt) ev.fail(line, fmt::format("the argument {} is missing", name));
    return dflt;
  }
  return to_str(*v);
}

List iterate(Evaluator& ev, const Value& v, int line, const std::string& filter) {
  switch (v.t) {
    case Value::T::undefined: return {};
    case Value::T::list: {
      List l = *v.l;
      if (v.seq == Value::Seq::generator) v.l->clear();  // read once
      return l;
    }
    case Value::T::dict: {
      List l;
      for (const auto& kv : v.d->items) l.push_back(key_value(kv.first));
      return l;
    }
    case Value::T::string: {
      auto cps = code_points(v.s);
      List l;
      for (size_t i = 0; i < cps.size(); ++i) l.push_back(Value::string(utf8(cps, i, i + 1)));
      return l;
    }
    default: ev.fail(line, fmt::format("{}: '{}' object is not iterable", filter, type_name(v)));
  }
}

// An attribute path "a.b" or "0" as Jinja2's make_attrgetter reads it.
Value attr_of(Evaluator& ev, const Value& v, const std::string& path, int line) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (cur.t == Value::T::dict) {
      const Value* x = cur.d->find(part);
      cur = x ? *x : Value::undefined(part);
    } else if (cur.t == Value::T::list && !part.empty() && part.size() < 10 &&
               std::all_of(part.begin(), part.end(), ::isdigit)) {
      size_t k = std::stoul(part);
      cur = k < cur.l->size() ? (*cur.l)[k] : Value::undefined(part);
    } else if (cur.is_undefined()) {
      ev.fail(line, fmt::format("'{}' is undefined (its attribute {} was read)", cur.s, part));
    } else {
      cur = Value::undefined(part);
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

// select/reject/selectattr/rejectattr: keep the items whose test (or truth) is `keep`.
Value select(Evaluator& ev, const Value& v, Args& a, bool by_attr, bool keep, int line, const char* name) {
  size_t off = by_attr ? 1 : 0;
  std::string attr = by_attr ? str_arg(ev, a, 0, "attribute", nullptr, line) : "";
  Args rest;
  std::string test;
  if (a.pos.size() > off) test = to_str(a.pos[off]);
  for (size_t i = off + 1; i < a.pos.size(); ++i) rest.pos.push_back(a.pos[i]);
  List out;
  if (!truthy(v)) return generator({});
  for (const Value& x : iterate(ev, v, line, name)) {
    Value subject = by_attr ? attr_of(ev, x, attr, line) : x;
    bool t = test.empty() ? truthy(subject) : apply_test(ev, test, subject, rest, line);
    if (t == keep) out.push_back(x);
  }
  return generator(std::move(out));
}

Value sorted(Evaluator& ev, const Value& v, const Args& a, int line) {
  List l = iterate(ev, v, line, "sort");
  bool reverse = a.get(0, "reverse") && truthy(*a.get(0, "reverse"));
  bool cs = a.get(1, "case_sensitive") && truthy(*a.get(1, "case_sensitive"));
  const Value* attr = a.get(2, "attribute");
  auto key = [&](const Value& x) {
    Value k = attr ? attr_of(ev, x, to_str(*attr), line) : x;
    if (!cs && k.t == Value::T::string) k.s = lower(k.s);
    return k;
  };
  std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
    Value kx = key(x), ky = key(y);
    if (kx.t == Value::T::string && ky.t == Value::T::string) return reverse ? ky.s < kx.s : kx.s < ky.s;
    if (kx.is_number() && ky.is_number()) return reverse ? ky.as_double() < kx.as_double() : kx.as_double() < ky.as_double();
    ev.fail(line, fmt::format("sort: '<' not supported between '{}' and '{}'", type_name(kx), type_name(ky)));
  });
  return Value::list(std::move(l));
}

}  // namespace

Value apply_filter(Evaluator& ev, const std::string& name, Value v, Args& a, int line) {
  const std::string& f = name;
  if (f == "safe" || f == "string" || f == "e" || f == "escape" || f == "forceescape") {
    if (f == "string" && v.t == Value::T::string) return v;
    bool was_markup = v.t == Value::T::string && v.markup;
    Value r = Value::string(to_str(v));
    if (f == "string") return r;
    if (f != "safe" && (f == "forceescape" || !was_markup)) r.s = html_escape(r.s);
    r.markup = true;
    return r;
  }
  if (f == "trim") {
    if (const Value* chars = a.get(0, "chars"); chars && chars->t != Value::T::none) return Value::string(py_strip(to_str(v), to_str(*chars), true, true));
    return Value::string(py_strip(to_str(v), std::nullopt, true, true));
  }
  if (f == "upper") return Value::string(upper(to_str(v)));
  if (f == "lower") return Value::string(lower(to_str(v)));
  if (f == "capitalize") return Value::string(capitalize(to_str(v)));
  if (f == "title") return Value::string(title(to_str(v)));
  if (f == "replace") {
    std::string r = replace(to_str(v), str_arg(ev, a, 0, "old", nullptr, line), str_arg(ev, a, 1, "new", nullptr, line),
                            int_arg(ev, a, 2, "count", -1, line));
    ev.check_size(r.size(), line);
    return Value::string(std::move(r));
  }
  if (f == "length" || f == "count") {
    switch (v.t) {
      case Value::T::undefined: return Value::integer(0);
      case Value::T::string: return Value::integer(int64_t(code_point_count(v.s)));
      case Value::T::list:
        if (v.seq == Value::Seq::generator) ev.fail(line, "object of type 'generator' has no len()");
        return Value::integer(int64_t(v.l->size()));
      case Value::T::dict: return Value::integer(int64_t(v.d->items.size()));
      default: ev.fail(line, fmt::format("object of type '{}' has no len()", type_name(v)));
    }
  }
  if (f == "join") {
    std::string sep = str_arg(ev, a, 0, "d", "", line), o;
    const Value* attr = a.get(1, "attribute");
    bool first = true;
    for (const Value& x : iterate(ev, v, line, "join")) {
      if (!first) o += sep;
      first = false;
      o += to_str(attr ? attr_of(ev, x, to_str(*attr), line) : x);
      ev.check_size(o.size(), line);
    }
    return Value::string(std::move(o));
  }
  if (f == "tojson") {
    const Value* ind = a.get(1, "indent");
    int indent = -1;
    if (ind && ind->t == Value::T::integer) indent = int(ind->i);
    else if (ind && ind->t != Value::T::none) ev.fail(line, "tojson: indent must be an integer");
    const Value* ascii = a.get(0, "ensure_ascii");
    const Value* sep = a.get(2, "separators");
    const Value* sk = a.get(3, "sort_keys");
    std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
    if (sep && sep->t == Value::T::list && sep->l->size() == 2) item_sep = to_str((*sep->l)[0]), key_sep = to_str((*sep->l)[1]);
    try {
      std::string s = to_json(v, indent, sk && truthy(*sk), ascii && truthy(*ascii), item_sep, key_sep);
      ev.check_size(s.size(), line);
      return Value::string(std::move(s));
    } catch (const Error& e) {
      ev.fail(line, std::string(without_source_place(e.what())));
    }
  }
  if (f == "items") {
    if (v.is_undefined()) return Value::list();
    if (v.t != Value::T::dict) ev.fail(line, fmt::format("items: a {} is not a mapping", type_name(v)));
    List l;
    for (const auto& [k, x] : v.d->items) {
      Value pair = Value::list({key_value(k), x});
      pair.tuple = true;
      l.push_back(std::move(pair));
    }
    return generator(std::move(l));
  }
  if (f == "list") return Value::list(iterate(ev, v, line, "list"));
  if (f == "first" || f == "last") {
    if (v.t == Value::T::list && v.seq == Value::Seq::generator) {
      if (f == "last") ev.fail(line, "last: 'generator' object is not reversible");
      if (v.l->empty()) return Value::undefined(f);
      Value x = v.l->front();
      v.l->erase(v.l->begin());  // read once
      return x;
    }
    List l = iterate(ev, v, line, f);
    if (l.empty()) return Value::undefined(f);
    return f == "first" ? l.front() : l.back();
  }
  if (f == "reverse") {
    if (v.t == Value::T::string) {
      auto cps = code_points(v.s);
      std::reverse(cps.begin(), cps.end());
      return Value::string(utf8(cps, 0, cps.size()));
    }
    List l = iterate(ev, v, line, "reverse");
    std::reverse(l.begin(), l.end());
    return Value::list(std::move(l));
  }
  if (f == "default" || f == "d") {
    const Value* dflt = a.get(0, "default_value");
    const Value* boolean = a.get(1, "boolean");
    bool use = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
    if (use) return dflt ? *dflt : Value::string("");
    return v;
  }
  if (f == "int") {
    if (v.t == Value::T::integer) return v;
    if (v.t == Value::T::boolean) return Value::integer(v.b);
    auto from_double = [&](double d) {
      if (!(std::fabs(d) < 9.2e18)) ev.fail(line, fmt::format("int: {} does not fit 64 bits (refused)", format_float(d)));
      return Value::integer(int64_t(d));
    };
    if (v.t == Value::T::floating) return from_double(v.f);
    if (v.t == Value::T::string) {
      std::string s = py_strip(v.s, std::nullopt, true, true);
      try {
        size_t used = 0;
        int64_t x = std::stoll(s, &used);
        if (used == s.size()) return Value::integer(x);
        double d = std::stod(s, &used);
        if (used == s.size()) return from_double(d);
      } catch (const std::exception&) {
      }
    }
    return Value::integer(int_arg(ev, a, 0, "default", 0, line));
  }
  if (f == "float") {
    if (v.is_number()) return Value::floating(v.as_double());
    if (v.t == Value::T::string) {
      try {
        size_t used = 0;
        std::string s = py_strip(v.s, std::nullopt, true, true);
        double d = std::stod(s, &used);
        if (used == s.size()) return Value::floating(d);
      } catch (const std::exception&) {
      }
    }
    const Value* d = a.get(0, "default");
    return d ? *d : Value::floating(0);
  }
  if (f == "abs") {
    if (v.t == Value::T::floating) return Value::floating(std::fabs(v.f));
    if (v.t == Value::T::integer && v.i == INT64_MIN) ev.fail(line, "abs: the smallest 64-bit integer overflows (refused)");
    if (v.is_number()) return Value::integer(std::llabs(v.t == Value::T::integer ? v.i : v.b));
    ev.fail(line, fmt::format("bad operand type for abs(): '{}'", type_name(v)));
  }
  if (f == "map") {
    List out;
    if (!truthy(v)) return generator({});
    if (const Value* attr = a.get(99, "attribute")) {
      const Value* dflt = a.get(99, "default");
      for (const Value& x : iterate(ev, v, line, "map")) {
        Value r = attr_of(ev, x, to_str(*attr), line);
        out.push_back(r.is_undefined() && dflt ? *dflt : r);
      }
      return generator(std::move(out));
    }
    if (a.pos.empty()) ev.fail(line, "map: needs a filter name or attribute=");
    std::string fname = to_str(a.pos[0]);
    Args rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const Value& x : iterate(ev, v, line, "map")) {
      Args copy = rest;
      out.push_back(apply_filter(ev, fname, x, copy, line));
    }
    return generator(std::move(out));
  }
  if (f == "select") return select(ev, v, a, false, true, line, "select");
  if (f == "reject") return select(ev, v, a, false, false, line, "reject");
  if (f == "selectattr") return select(ev, v, a, true, true, line, "selectattr");
  if (f == "rejectattr") return select(ev, v, a, true, false, line, "rejectattr");
  if (f == "unique") {
    List out;
    for (const Value& x : iterate(ev, v, line, "unique")) {
      bool seen = false;
      for (const Value& y : out) seen = seen || equal(x, y);
      if (!seen) out.push_back(x);
    }
    return generator(std::move(out));
  }
  if (f == "sort") return sorted(ev, v, a, line);
  if (f == "dictsort") {
    if (v.t != Value::T::dict) ev.fail(line, "dictsort: needs a mapping");
    Args none;
    Value items = apply_filter(ev, "items", v, none, line);
    const bool cs = a.get(0, "case_sensitive") && truthy(*a.get(0, "case_sensitive"));
    const std::string by = str_arg(ev, a, 1, "by", "key", line);
    const bool reverse = a.get(2, "reverse") && truthy(*a.get(2, "reverse"));
    if (by != "key" && by != "value") ev.fail(line, "dictsort: by must be 'key' or 'value'");
    const size_t at = by == "key" ? 0 : 1;
    std::stable_sort(items.l->begin(), items.l->end(), [&](const Value& x, const Value& y) {
      const Value &p = (*x.l)[at], &q = (*y.l)[at];
      if (p.t == Value::T::string && q.t == Value::T::string)
        return reverse ? (cs ? q.s < p.s : lower(q.s) < lower(p.s)) : (cs ? p.s < q.s : lower(p.s) < lower(q.s));
      if (p.is_number() && q.is_number()) return reverse ? q.as_double() < p.as_double() : p.as_double() < q.as_double();
      ev.fail(line, fmt::format("dictsort: cannot order a {} and a {}", type_name(p), type_name(q)));
    });
    items.seq = Value::Seq::plain;
    return items;
  }
  if (f == "sum" || f == "min" || f == "max") {
    List l = iterate(ev, v, line, f);
    if (f == "sum") {
      Value acc = Value::integer(int_arg(ev, a, 1, "start", 0, line));
      for (const Value& x : l) {
        if (!x.is_number()) ev.fail(line, "sum: the items must be numbers");
        int64_t r = 0;
        if (acc.t == Value::T::floating || x.t == Value::T::floating)
          acc = Value::floating(acc.as_double() + x.as_double());
        else if (__builtin_add_overflow(acc.i, x.t == Value::T::integer ? x.i : int64_t(x.b), &r))
          ev.fail(line, "sum: overflows 64 bits (refused)");
        else
          acc = Value::integer(r);
      }
      return acc;
    }
    if (l.empty()) return Value::undefined(f);
    Value best = l[0];
    for (const Value& x : l) {
      bool less;
      if (x.is_number() && best.is_number()) less = x.as_double() < best.as_double();
      else if (x.t == Value::T::string && best.t == Value::T::string) less = lower(x.s) < lower(best.s);
      else ev.fail(line, f + ": the items cannot be compared");
      if (f == "min" ? less : (!less && !equal(x, best))) best = x;
    }
    return best;
  }
  if (f == "round") {
    int64_t prec = int_arg(ev, a, 0, "precision", 0, line);
    std::string method = str_arg(ev, a, 1, "method", "common", line);
    if (!v.is_number()) ev.fail(line, fmt::format("round: a {} is not a number", type_name(v)));
    double x = v.as_double(), m = std::pow(10.0, double(prec));
    if (method == "ceil") return Value::floating(std::ceil(x * m) / m);
    if (method == "floor") return Value::floating(std::floor(x * m) / m);
    if (method != "common") ev.fail(line, "round: the method must be common, ceil or floor");
    // Python's round(): the decimal nearest the double's exact value, ties to even, as printf's.
    if (prec < 0 || prec > 300 || !std::isfinite(x)) return Value::floating(std::nearbyint(x * m) / m);
    std::string digits = fmt::format("{:.{}f}", x, prec);
    return Value::floating(std::strtod(digits.c_str(), nullptr));
  }
  if (f == "indent") {
    int64_t width = int_arg(ev, a, 0, "width", 4, line);
    bool first = a.get(1, "first") && truthy(*a.get(1, "first"));
    bool blank = a.get(2, "blank") && truthy(*a.get(2, "blank"));
    std::string pad(size_t(std::max<int64_t>(0, width)), ' '), s = to_str(v), o;
    if (const Value* w = a.get(0, "width"); w && w->t == Value::T::string) pad = w->s;
    size_t start = 0;
    bool is_first = true;
    while (true) {
      size_t nl = s.find('\n', start);
      std::string ln = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      bool add = is_first ? first : (blank || !py_strip(ln, std::nullopt, true, true).empty());
      if (add) o += pad;
      o += ln;
      if (nl == std::string::npos) break;
      o += '\n';
      start = nl + 1;
      is_first = false;
    }
    ev.check_size(o.size(), line);
    return Value::string(std::move(o));
  }
  if (f == "wordcount") return Value::integer(int64_t(py_split(to_str(v), std::nullopt, -1).size()));
  if (f == "center") {
    int64_t width = int_arg(ev, a, 0, "width", 80, line);
    std::string s = to_str(v);
    int64_t n = int64_t(code_point_count(s));
    if (width <= n) return Value::string(s);
    int64_t total = width - n, left = total / 2 + (total & width & 1);
    ev.check_size(size_t(width), line);
    return Value::string(std::string(size_t(left), ' ') + s + std::string(size_t(total - left), ' '));
  }
  if (f == "format") return Value::string(percent_format(ev, to_str(v), a, line));
  if (f == "attr") return attr_of(ev, v, str_arg(ev, a, 0, "name", nullptr, line), line);
  if (f == "batch" || f == "slice" || f == "groupby" || f == "pprint" || f == "random" || f == "striptags" ||
      f == "truncate" || f == "urlencode" || f == "urlize" || f == "wordwrap" || f == "xmlattr" || f == "filesizeformat")
    ev.fail(line, fmt::format("the filter '{}' is not supported", f));
  ev.fail(line, fmt::format("no filter named '{}'", f));
}

bool apply_test(Evaluator& ev, const std::string& t, const Value& v, Args& a, int line) {
  auto arg = [&]() -> const Value& {
    if (a.pos.empty()) ev.fail(line, fmt::format("the test '{}' needs an argument", t));
    return a.pos[0];
  };
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.t == Value::T::none;
  if (t == "boolean") return v.t == Value::T::boolean;
  if (t == "true") return v.t == Value::T::boolean && v.b;
  if (t == "false") return v.t == Value::T::boolean && !v.b;
  if (t == "string") return v.t == Value::T::string;
  if (t == "number") return v.is_number();
  if (t == "integer") return v.t == Value::T::integer;
  if (t == "float") return v.t == Value::T::floating;
  if (t == "mapping") return v.t == Value::T::dict;
  if (t == "sequence") return (v.t == Value::T::list && v.seq == Value::Seq::plain) || v.t == Value::T::string || v.t == Value::T::dict;
  if (t == "iterable") return v.t == Value::T::list || v.t == Value::T::string || v.t == Value::T::dict || v.is_undefined();
  if (t == "callable") return v.t == Value::T::func;
  if (t == "lower") return v.t == Value::T::string && lower(v.s) == v.s;
  if (t == "upper") return v.t == Value::T::string && upper(v.s) == v.s;
  if (t == "escaped") return false;
  if (t == "odd" || t == "even" || t == "divisibleby") {
    if (v.t != Value::T::integer && v.t != Value::T::boolean) ev.fail(line, fmt::format("the test '{}' needs an integer", t));
    int64_t x = v.t == Value::T::integer ? v.i : v.b;
    if (t == "divisibleby") {
      const Value& d = arg();
      if (d.t != Value::T::integer || d.i == 0) ev.fail(line, "divisibleby needs a nonzero integer");
      return x % d.i == 0;
    }
    return (x % 2 != 0) == (t == "odd");
  }
  if (t == "eq" || t == "equalto" || t == "==") return equal(v, arg());
  if (t == "ne" || t == "!=") return !equal(v, arg());
  if (t == "sameas") return equal(v, arg()) && v.t == arg().t;
  if (t == "in") {
    const Value& h = arg();
    if (h.t == Value::T::string) return v.t == Value::T::string && h.s.find(v.s) != std::string::npos;
    if (h.t == Value::T::list) return std::any_of(h.l->begin(), h.l->end(), [&](const Value& x) { return equal(x, v); });
    if (h.t == Value::T::dict) return dict_key(v) && h.d->find(*dict_key(v));
    ev.fail(line, "the test 'in' needs a container");
  }
  if (t == "gt" || t == "ge" || t == "lt" || t == "le" || t == ">" || t == "<" || t == ">=" || t == "<=") {
    const Value& o = arg();
    if (!(v.is_number() && o.is_number()) && !(v.t == Value::T::string && o.t == Value::T::string))
      ev.fail(line, fmt::format("the test '{}' cannot compare '{}' and '{}'", t, type_name(v), type_name(o)));
    int c = v.t == Value::T::string ? (v.s < o.s ? -1 : v.s == o.s ? 0 : 1)
                                    : (v.as_double() < o.as_double() ? -1 : v.as_double() == o.as_double() ? 0 : 1);
    if (t == "gt" || t == ">") return c > 0;
    if (t == "ge" || t == ">=") return c >= 0;
    if (t == "lt" || t == "<") return c < 0;
    return c <= 0;
  }
  if (t == "filter" || t == "test") ev.fail(line, fmt::format("the test '{}' is not supported", t));
  ev.fail(line, fmt::format("no test named '{}'", t));
}

}  // namespace fsdp::data::jinja
