// The methods a Jinja template may call on its values, as Python's str, dict and list have them
// (the immutable sandbox's set: a list's append, a dict's update and the like are refused, as
// Jinja2's ImmutableSandboxedEnvironment refuses them), and the string helpers behind them.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "jinja_strings.h"

namespace fsdp::data::jinja {
namespace {

bool py_space(uint32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

uint32_t to_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7) || (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) || (c >= 0x430 && c <= 0x44f)) return c - 32;
  if (c == 0xff) return 0x178;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  if (c == 0x3c2) return 0x3a3;
  return c;
}

uint32_t to_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xc0 && c <= 0xde && c != 0xd7) || (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) || (c >= 0x410 && c <= 0x42f)) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  if (c == 0x178) return 0xff;
  return c;
}

bool cased(uint32_t c) { return to_upper(c) != c || to_lower(c) != c || c == 0xdf; }

std::string map_case(const std::string& s, bool up) {
  bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (ascii) {
    std::string o = s;
    for (char& c : o) c = char(up ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
    return o;
  }
  auto cps = code_points(s);
  std::vector<uint32_t> out;
  for (uint32_t c : cps) {
    if (up && c == 0xdf) {
      out.push_back('S');
      out.push_back('S');
    } else {
      out.push_back(up ? to_upper(c) : to_lower(c));
    }
  }
  return utf8(out, 0, out.size());
}

Value strings(List l) {
  return Value::list(std::move(l));
}

}  // namespace

std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  auto cps = code_points(s);
  std::vector<uint32_t> set;
  if (chars) set = code_points(*chars);
  auto strip = [&](uint32_t c) { return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_space(c); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip(cps[b])) ++b;
  if (right)
    while (e > b && strip(cps[e - 1])) --e;
  return utf8(cps, b, e);
}

std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t start = 0;
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      size_t k = s.find(*sep, start);
      if (k == std::string::npos) break;
      out.push_back(s.substr(start, k - start));
      start = k + sep->size();
    }
    out.push_back(s.substr(start));
    return out;
  }
  auto cps = code_points(s);
  size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && py_space(cps[i])) ++i;
    if (i >= cps.size()) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      size_t e = cps.size();
      while (e > i && py_space(cps[e - 1])) --e;
      out.push_back(utf8(cps, i, e));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !py_space(cps[j])) ++j;
    out.push_back(utf8(cps, i, j));
    i = j;
  }
  return out;
}

std::string upper(const std::string& s) { return map_case(s, true); }
std::string lower(const std::string& s) { return map_case(s, false); }

std::string capitalize(const std::string& s) {
  auto cps = code_points(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? to_upper(cps[i]) : to_lower(cps[i]);
  return utf8(cps, 0, cps.size());
}

std::string title(const std::string& s) {
  auto cps = code_points(s);
  bool start = true;
  for (auto& c : cps) {
    bool sep = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      start = true;
      continue;
    }
    c = start ? to_upper(c) : to_lower(c);
    start = false;
  }
  return utf8(cps, 0, cps.size());
}

static std::string py_title(const std::string& s) {
  auto cps = code_points(s);
  bool prev_cased = false;
  for (auto& c : cps) {
    bool is_cased = cased(c);
    if (is_cased) c = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = is_cased;
  }
  return utf8(cps, 0, cps.size());
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string o;
  if (from.empty()) {
    auto cps = code_points(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) o += to, ++n;
      if (i < cps.size()) o += utf8(cps, i, i + 1);
    }
    return o;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t k = s.find(from, start);
    if (k == std::string::npos) break;
    o += s.substr(start, k - start) + to;
    start = k + from.size();
    ++n;
  }
  return o + s.substr(start);
}

std::string percent_format(Evaluator& ev, const std::string& f, const Args& a, int line) {
  std::string o;
  size_t next = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      o += f[i];
      continue;
    }
    if (i + 1 >= f.size()) ev.fail(line, "'%' formatting: incomplete format");
    char c = f[++i];
    if (c == '%') {
      o += '%';
      continue;
    }
    if (next >= a.pos.size()) ev.fail(line, "'%' formatting: not enough arguments for format string");
    const Value& v = a.pos[next++];
    if (c == 's') o += to_str(v);
    else if (c == 'r') o += repr(v);
    else if ((c == 'd' || c == 'i') && v.t == Value::T::floating && std::fabs(v.f) < 9.2e18) o += std::to_string(int64_t(v.f));
    else if ((c == 'd' || c == 'i') && (v.t == Value::T::integer || v.t == Value::T::boolean)) o += std::to_string(v.t == Value::T::integer ? v.i : v.b);
    else ev.fail(line, fmt::format("'%' formatting: the conversion '%{}' is not supported", c));
  }
  if (next < a.pos.size()) ev.fail(line, "'%' formatting: not all arguments converted during string formatting");
  return o;
}

static std::string brace_format(Evaluator& ev, const std::string& f, const Args& a, int line) {
  std::string o;
  size_t next = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      o += '}', ++i;
      continue;
    }
    if (f[i] != '{') {
      o += f[i];
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      o += '{', ++i;
      continue;
    }
    size_t e = f.find('}', i);
    if (e == std::string::npos) ev.fail(line, "str.format: a '{' is not closed");
    std::string field = f.substr(i + 1, e - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) ev.fail(line, "str.format: format specs and conversions are not supported");
    const Value* v = nullptr;
    if (field.empty()) v = next < a.pos.size() ? &a.pos[next++] : nullptr;
    else if (field.size() < 10 && std::all_of(field.begin(), field.end(), ::isdigit)) v = a.get(std::stoul(field), "");
    else v = a.get(size_t(-1), field);
    if (!v) ev.fail(line, fmt::format("str.format: no argument for '{{{}}}'", field));
    o += to_str(*v);
    i = e;
  }
  return o;
}

Value call_method(Evaluator& ev, const Value& obj, const std::string& m, Args& a, int line) {
  auto str = [&](size_t i, const char* name) -> std::optional<std::string> {
    const Value* v = a.get(i, name);
    if (!v || v->t == Value::T::none) return std::nullopt;
    if (v->t != Value::T::string) ev.fail(line, fmt::format("str.{}: the argument must be a string, got {}", m, type_name(*v)));
    return v->s;
  };
  auto integer = [&](size_t i, const char* name, int64_t dflt) {
    const Value* v = a.get(i, name);
    return v && v->t == Value::T::integer ? v->i : dflt;
  };
  if (obj.t == Value::T::string) {
    const std::string& s = obj.s;
    if (m == "startswith" || m == "endswith") {
      const Value* p = a.get(0, "prefix");
      if (!p) ev.fail(line, fmt::format("str.{} needs an argument", m));
      List pats = p->t == Value::T::list ? *p->l : List{*p};
      for (const Value& x : pats) {
        if (x.t != Value::T::string) ev.fail(line, fmt::format("str.{}: the argument must be a string or tuple", m));
        if (m == "startswith" ? s.starts_with(x.s) : s.ends_with(x.s)) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (m == "strip" || m == "lstrip" || m == "rstrip")
      return Value::string(py_strip(s, str(0, "chars"), m != "rstrip", m != "lstrip"));
    if (m == "split" || m == "rsplit") {
      auto sep = str(0, "sep");
      if (sep && sep->empty()) ev.fail(line, "str.split: empty separator");
      int64_t maxsplit = integer(1, "maxsplit", -1);
      if (m == "rsplit" && maxsplit >= 0) ev.fail(line, "str.rsplit with maxsplit is not supported");
      List l;
      for (auto& part : py_split(s, sep, maxsplit)) l.push_back(Value::string(std::move(part)));
      return strings(std::move(l));
    }
    if (m == "splitlines") {
      List l;
      size_t start = 0;
      while (start < s.size()) {
        size_t k = s.find_first_of("\n\r", start);
        if (k == std::string::npos) {
          l.push_back(Value::string(s.substr(start)));
          break;
        }
        l.push_back(Value::string(s.substr(start, k - start)));
        start = k + (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n' ? 2 : 1);
      }
      return strings(std::move(l));
    }
    if (m == "upper") return Value::string(upper(s));
    if (m == "lower") return Value::string(lower(s));
    if (m == "title") return Value::string(py_title(s));
    if (m == "capitalize") return Value::string(capitalize(s));
    if (m == "replace") {
      auto from = str(0, "old"), to = str(1, "new");
      if (!from || !to) ev.fail(line, "str.replace needs two strings");
      std::string r = replace(s, *from, *to, integer(2, "count", -1));
      ev.check_size(r.size(), line);
      return Value::string(std::move(r));
    }
    if (m == "find" || m == "rfind" || m == "index" || m == "rindex" || m == "count") {
      auto sub = str(0, "sub");
      if (!sub) ev.fail(line, fmt::format("str.{} needs a string", m));
      if (m == "count") {
        if (sub->empty()) return Value::integer(int64_t(code_point_count(s)) + 1);
        int64_t n = 0;
        for (size_t k = s.find(*sub); k != std::string::npos; k = s.find(*sub, k + sub->size())) ++n;
        return Value::integer(n);
      }
      size_t k = m[0] == 'r' ? s.rfind(*sub) : s.find(*sub);
      if (k == std::string::npos) {
        if (m == "index" || m == "rindex") ev.fail(line, "str.index: substring not found");
        return Value::integer(-1);
      }
      return Value::integer(int64_t(code_point_count(s.substr(0, k))));
    }
    if (m == "join") {
      const Value* l = a.get(0, "iterable");
      if (!l || l->t != Value::T::list) ev.fail(line, "str.join needs a list");
      std::string o;
      for (size_t k = 0; k < l->l->size(); ++k) {
        const Value& x = (*l->l)[k];
        if (x.t != Value::T::string) ev.fail(line, fmt::format("str.join: item {} is a {}, not a str", k, type_name(x)));
        if (k) o += s;
        o += x.s;
        ev.check_size(o.size(), line);
      }
      return Value::string(std::move(o));
    }
    if (m == "isdigit" || m == "isalpha" || m == "isalnum" || m == "isspace" || m == "isupper" || m == "islower") {
      if (s.empty()) return Value::boolean(false);
      auto cps = code_points(s);
      if (m == "isspace") return Value::boolean(std::all_of(cps.begin(), cps.end(), py_space));
      if (m == "isupper" || m == "islower") {
        bool any = false, ok = true;
        for (uint32_t c : cps)
          if (cased(c)) any = true, ok = ok && (m == "isupper" ? to_upper(c) == c : to_lower(c) == c);
        return Value::boolean(any && ok);
      }
      bool ok = std::all_of(cps.begin(), cps.end(), [&](uint32_t c) {
        if (c >= 0x80) ev.fail(line, fmt::format("str.{} on non-ASCII text is not supported", m));
        return m == "isdigit" ? std::isdigit(int(c)) != 0 : m == "isalpha" ? std::isalpha(int(c)) != 0 : std::isalnum(int(c)) != 0;
      });
      return Value::boolean(ok);
    }
    if (m == "format") {
      std::string r = brace_format(ev, s, a, line);
      ev.check_size(r.size(), line);
      return Value::string(std::move(r));
    }
  } else if (obj.t == Value::T::dict && !obj.d->is_namespace) {
    if (m == "items" || m == "keys" || m == "values") {
      List l;
      for (const auto& [k, v] : obj.d->items) {
        if (m == "keys") {
          l.push_back(key_value(k));
        } else if (m == "values") {
          l.push_back(v);
        } else {
          Value pair = Value::list({key_value(k), v});
          pair.tuple = true;
          l.push_back(std::move(pair));
        }
      }
      Value view = Value::list(std::move(l));
      view.seq = m == "items" ? Value::Seq::items : m == "keys" ? Value::Seq::keys : Value::Seq::values;
      return view;
    }
    if (m == "get") {
      const Value* k = a.get(0, "key");
      if (!k) ev.fail(line, "dict.get needs a key");
      auto key = dict_key(*k);
      const Value* v = key ? obj.d->find(*key) : nullptr;
      if (v) return *v;
      const Value* d = a.get(1, "default");
      return d ? *d : Value::none();
    }
    if (m == "update" || m == "pop" || m == "popitem" || m == "setdefault" || m == "clear")
      ev.fail(line, fmt::format("dict.{} is unsafe in the immutable sandbox (refused, as Jinja2 refuses it)", m));
  } else if (obj.t == Value::T::list) {
    if (m == "index" || m == "count") {
      const Value* x = a.get(0, "value");
      if (!x) ev.fail(line, fmt::format("list.{} needs a value", m));
      int64_t n = 0;
      for (size_t k = 0; k < obj.l->size(); ++k) {
        if (!equal((*obj.l)[k], *x)) continue;
        if (m == "index") return Value::integer(int64_t(k));
        ++n;
      }
      if (m == "index") ev.fail(line, "list.index: the value is not in the list");
      return Value::integer(n);
    }
    if (m == "append" || m == "extend" || m == "pop" || m == "insert" || m == "remove" || m == "sort" || m == "reverse" || m == "clear")
      ev.fail(line, fmt::format("list.{} is unsafe in the immutable sandbox (refused, as Jinja2 refuses it)", m));
  }
  ev.fail(line, fmt::format("'{}' object has no method '{}' the engine supports", type_name(obj), m));
}

}  // namespace fsdp::data::jinja
