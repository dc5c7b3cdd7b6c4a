// The Jinja engine's values as Python shows them: truth, equality, str() and repr() (a list
// prints as ['a', 1], a float as Python's shortest round-trip repr), and transformers' tojson
// (json.dumps with ensure_ascii=False: ", " and ": " separators, non-ASCII text as is).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <compare>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "jinja_impl.h"
#include "src/data/byte_level.h"

namespace fsdp::data::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

const Value* Args::get(size_t i, std::string_view name) const {
  if (i < pos.size()) return &pos[i];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

std::optional<std::string> dict_key(const Value& v) {
  if (v.t == Value::T::string) return v.s;
  if (v.t == Value::T::integer) return std::string(1, '\0') + std::to_string(v.i);
  return std::nullopt;
}

Value key_value(const std::string& key) {
  if (!key.empty() && key[0] == '\0') return Value::integer(std::stoll(key.substr(1)));
  return Value::string(key);
}

static std::string key_text(const std::string& key) {
  return !key.empty() && key[0] == '\0' ? key.substr(1) : key;
}

uint32_t depth_of(const List& l) {
  uint32_t d = 0;
  for (const Value& x : l) d = std::max(d, x.depth);
  return uint32_t(d + 1);
}

uint32_t depth_of(const Dict& dict) {
  uint32_t d = 0;
  for (const auto& kv : dict.items) d = std::max(d, kv.second.depth);
  return uint32_t(d + 1);
}

Value Value::list(List v) {
  Value x = with(T::list);
  x.depth = depth_of(v);
  x.l = std::make_shared<List>(std::move(v));
  return x;
}

Value Value::dict(Dict v) {
  Value x = with(T::dict);
  x.depth = depth_of(v);
  x.d = std::make_shared<Dict>(std::move(v));
  return x;
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
  FSDP_CHECK(depth < kMaxValueDepth, "[jinja] the context nests deeper than {} levels", kMaxValueDepth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::integer(int64_t(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& x : j) l.push_back(from_json(x, depth + 1));
      return Value::list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, x] : j.items()) d.items.emplace_back(k, from_json(x, depth + 1));
      return Value::dict(std::move(d));
    }
    default: FSDP_FAIL("[jinja] the context holds a JSON value of an unsupported type ({})", j.type_name());
  }
}

bool truthy(const Value& v) {
  switch (v.t) {
    case Value::T::undefined:
    case Value::T::none: return false;
    case Value::T::boolean: return v.b;
    case Value::T::integer: return v.i != 0;
    case Value::T::floating: return v.f != 0;
    case Value::T::string: return !v.s.empty();
    case Value::T::list: return v.seq == Value::Seq::generator || !v.l->empty();
    case Value::T::dict: return !v.d->items.empty();
    default: return true;
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.t == Value::T::floating || b.t == Value::T::floating) return a.as_double() == b.as_double();
    return (a.t == Value::T::integer ? a.i : int64_t(a.b)) == (b.t == Value::T::integer ? b.i : int64_t(b.b));
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case Value::T::undefined:
    case Value::T::none: return true;
    case Value::T::string: return a.s == b.s;
    case Value::T::list:
      if (a.seq == Value::Seq::generator || b.seq == Value::Seq::generator) return a.l == b.l;
      if (a.tuple != b.tuple || a.seq != b.seq || a.l->size() != b.l->size()) return false;
      for (size_t i = 0; i < a.l->size(); ++i)
        if (!equal((*a.l)[i], (*b.l)[i])) return false;
      return true;
    case Value::T::dict:
      if (a.d->is_namespace || b.d->is_namespace) return a.d == b.d;
      if (a.d->items.size() != b.d->items.size()) return false;
      for (const auto& [k, v] : a.d->items) {
        const Value* o = b.d->find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    default: return a.fn == b.fn && a.macro == b.macro;
  }
}

std::string type_name(const Value& v) {
  switch (v.t) {
    case Value::T::undefined: return "Undefined";
    case Value::T::none: return "NoneType";
    case Value::T::boolean: return "bool";
    case Value::T::integer: return "int";
    case Value::T::floating: return "float";
    case Value::T::string: return "str";
    case Value::T::list:
      switch (v.seq) {
        case Value::Seq::generator: return "generator";
        case Value::Seq::items: return "dict_items";
        case Value::Seq::keys: return "dict_keys";
        case Value::Seq::values: return "dict_values";
        default: return v.tuple ? "tuple" : "list";
      }
    case Value::T::dict: return v.d->is_namespace ? "Namespace" : "dict";
    default: return "function";
  }
}

std::string format_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, f);  // shortest round trip
  std::string s(buf, r.ptr);
  // to_chars picks fixed or scientific by length; Python uses scientific when exp < -4 or >= 16.
  int exp10 = f == 0 ? 0 : int(std::floor(std::log10(std::fabs(f))));
  char digits[64];
  auto rs = std::to_chars(digits, digits + sizeof digits, f, std::chars_format::scientific);
  std::string sci(digits, rs.ptr);  // d.ddde+XX
  size_t epos = sci.find('e');
  exp10 = std::stoi(sci.substr(epos + 1));
  if (exp10 < -4 || exp10 >= 16) {
    std::string mant = sci.substr(0, epos);
    int e = exp10;
    return fmt::format("{}e{}{:02d}", mant, e < 0 ? '-' : '+', std::abs(e));
  }
  auto rf = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::fixed);
  s.assign(buf, rf.ptr);
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '"') o += "&#34;";
    else if (c == '\'') o += "&#39;";
    else o += c;
  }
  return o;
}

static std::string repr_string(const std::string& s) {
  char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string o(1, q);
  for (unsigned char c : s) {
    if (c == '\\') o += "\\\\";
    else if (c == static_cast<unsigned char>(q)) (o += '\\') += char(c);
    else if (c == '\n') o += "\\n";
    else if (c == '\r') o += "\\r";
    else if (c == '\t') o += "\\t";
    else if (c < 0x20 || c == 0x7f) o += fmt::format("\\x{:02x}", c);
    else o += char(c);
  }
  return o + q;
}

std::string repr(const Value& v) {
  switch (v.t) {
    case Value::T::string: return repr_string(v.s);
    case Value::T::list: {
      if (v.seq == Value::Seq::generator) return "<generator object>";
      if (v.seq != Value::Seq::plain) {
        Value plain = v;
        plain.seq = Value::Seq::plain;
        return type_name(v) + "(" + repr(plain) + ")";
      }
      std::string o = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.l->size(); ++i) o += (i ? ", " : "") + repr((*v.l)[i]);
      if (v.tuple && v.l->size() == 1) o += ",";
      return o + (v.tuple ? ")" : "]");
    }
    case Value::T::dict: {
      if (v.d->is_namespace) return "<Namespace>";
      std::string o = "{";
      bool first = true;
      for (const auto& [k, x] : v.d->items) {
        o += (first ? "" : ", ") + (!k.empty() && k[0] == '\0' ? key_text(k) : repr_string(k)) + ": " + repr(x);
        first = false;
      }
      return o + "}";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.t) {
    case Value::T::undefined: return "";
    case Value::T::none: return "None";
    case Value::T::boolean: return v.b ? "True" : "False";
    case Value::T::integer: return std::to_string(v.i);
    case Value::T::floating: return format_float(v.f);
    case Value::T::string: return v.s;
    case Value::T::func: return "<function>";
    default: return repr(v);
  }
}

static void json_string(std::string& o, const std::string& s, bool ascii) {
  o += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      default:
        if (c < 0x20) {
          o += fmt::format("\\u{:04x}", c);
        } else if (c >= 0x80 && ascii) {
          auto cps = code_points(s.substr(i, (c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2)));
          uint32_t cp = cps.empty() ? c : cps[0];
          i += (c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1);
          if (cp >= 0x10000) {
            cp -= 0x10000;
            o += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
          } else {
            o += fmt::format("\\u{:04x}", cp);
          }
        } else {
          o += char(c);
        }
    }
  }
  o += '"';
}

std::string to_json(const Value& v, int indent, bool sort_keys, bool ascii, std::string_view item_sep,
                    std::string_view key_sep, int depth) {
  FSDP_CHECK(depth < 200, "[jinja] tojson: a value nested deeper than 200 levels");
  auto nl = [&](int d) {
    std::string s;
    if (indent >= 0) s.append(1, '\n').append(size_t(indent) * size_t(d), ' ');
    return s;
  };
  std::string o;
  switch (v.t) {
    case Value::T::none: return "null";
    case Value::T::boolean: return v.b ? "true" : "false";
    case Value::T::integer: return std::to_string(v.i);
    case Value::T::floating:
      if (std::isnan(v.f)) return "NaN";
      if (std::isinf(v.f)) return v.f > 0 ? "Infinity" : "-Infinity";
      return format_float(v.f);
    case Value::T::string: json_string(o, v.s, ascii); return o;
    case Value::T::list: {
      if (v.seq != Value::Seq::plain)
        FSDP_FAIL("[jinja] tojson: Object of type {} is not JSON serializable", type_name(v));
      if (v.l->empty()) return "[]";
      o = "[";
      for (size_t i = 0; i < v.l->size(); ++i) {
        if (i) o += item_sep;
        o += nl(depth + 1) + to_json((*v.l)[i], indent, sort_keys, ascii, item_sep, key_sep, depth + 1);
      }
      return o + nl(depth) + "]";
    }
    case Value::T::dict: {
      if (v.d->is_namespace) FSDP_FAIL("[jinja] tojson: Object of type Namespace is not JSON serializable");
      if (v.d->items.empty()) return "{}";
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.d->items) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      o = "{";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) o += item_sep;
        o += nl(depth + 1);
        json_string(o, key_text(items[i]->first), ascii);
        o += key_sep;
        o += to_json(items[i]->second, indent, sort_keys, ascii, item_sep, key_sep, depth + 1);
      }
      return o + nl(depth) + "}";
    }
    default:
      FSDP_FAIL("[jinja] tojson: Object of type {} is not JSON serializable", type_name(v));
  }
}

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n && i + size_t(k) < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + size_t(k)]) & 0x3F);
    out.push_back(cp);
    i += size_t(n);
  }
  return out;
}

std::string utf8(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string o;
  for (size_t i = begin; i < end && i < cps.size(); ++i) {
    uint32_t cp = cps[i];
    byte_level::append_utf8(o, char32_t(cp));
  }
  return o;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace fsdp::data::jinja
