// TOML run configs (fsdp/train/config_file.h). toml++ parses; the keys go through set_flag, so a
// value is read exactly as the command line reads it.
#include "fsdp/train/config_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "src/core/json_read.h"

// FSDP_HAVE_TOML is set on this file alone by CMake (1 where toml++ was found).
#ifndef FSDP_HAVE_TOML
#define FSDP_HAVE_TOML 0
#endif
#if FSDP_HAVE_TOML
#include <toml++/toml.h>
#endif

namespace fsdp::train {

namespace fs = std::filesystem;

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// " (did you mean X?)" for the nearest of the candidates, when one is near enough.
std::string suggest(std::string_view name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t d = SIZE_MAX;
  for (const std::string& c : candidates)
    if (const size_t e = edit_distance(name, c); e < d) d = e, best = c;
  if (best.empty() || d > std::max<size_t>(2, name.size() / 3)) return "";
  return fmt::format(" (did you mean {}?)", best);
}

struct Known {
  std::vector<std::string> sections;
  std::vector<std::pair<std::string, std::string>> fields;  // section, field
};

Known known_flags() {
  Known k;
  TrainOptions o;
  visit_flags(o, [&](const FlagInfo& f, const auto&) {
    if (k.sections.empty() || k.sections.back() != f.section) k.sections.emplace_back(f.section);
    k.fields.emplace_back(f.section, f.field);
  });
  return k;
}

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\')
      out += fmt::format("\\{}", c);
    else if (static_cast<unsigned char>(c) < 0x20)
      out += fmt::format("\\u{:04x}", int(static_cast<unsigned char>(c)));
    else
      out += c;
  }
  return out + "\"";
}

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

#if FSDP_HAVE_TOML
std::string where(const fs::path& file, const toml::node& n) {
  return fmt::format("{}:{}", file.string(), n.source().begin.line);
}

// A key's value as the command line would write it.
std::string value_text(const fs::path& file, const std::string& key, const toml::node& n) {
  if (const auto* s = n.as_string()) return s->get();
  if (const auto* i = n.as_integer()) return std::to_string(i->get());
  if (const auto* f = n.as_floating_point()) return fmt::format("{}", f->get());
  if (const auto* b = n.as_boolean()) return b->get() ? "true" : "false";
  FSDP_FAIL("[config] {}: {}: expected a string, a number or a boolean, got a {}", where(file, n),
            key, n.type() == toml::node_type::array ? "list" : "table or date");
}

// Includes nest at most kMaxIncludeDepth files deep, and one --config reads at most
// kMaxIncludes files in all (a file included from two places counts twice): a chain of 10,000
// files would otherwise recurse 10,000 deep, and 30 files each including the next twice would be
// read 2^30 times.
constexpr size_t kMaxIncludeDepth = 64;
constexpr size_t kMaxIncludes = 1000;

void load(TrainOptions& o, const fs::path& path, std::vector<fs::path>& chain, size_t& loads,
          const Known& k) {
  std::error_code ec;
  const fs::path canon = fs::weakly_canonical(path, ec);
  if (std::find(chain.begin(), chain.end(), canon) != chain.end()) {
    std::string names;
    for (const fs::path& p : chain) names += p.string() + " -> ";
    FSDP_FAIL("[config] an include cycle: {}{}", names, canon.string());
  }
  FSDP_CHECK(chain.size() < kMaxIncludeDepth,
             "[config] {}: includes nest deeper than {} files (the limit), from {} down to {}",
             path.string(), kMaxIncludeDepth, chain.front().string(), chain.back().string());
  FSDP_CHECK(++loads <= kMaxIncludes,
             "[config] {}: more than {} files read through includes in all (the limit; a file "
             "included from several places counts each time), from {}",
             path.string(), kMaxIncludes, chain.empty() ? path.string() : chain.front().string());
  const bool there = fs::exists(path, ec);
  FSDP_CHECK(there || ec.value() != ELOOP,
             "[config] cannot open '{}': a loop of symbolic links (too many levels of links)",
             path.string());
  FSDP_CHECK(there, "[config] cannot open '{}': {}", path.string(),
             ec ? ec.message() : std::string("no such file"));
  check_regular(path.string(), "[config]");
  toml::table t;
  try {
    t = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    FSDP_FAIL("[config] {}:{}:{}: not TOML: {}", path.string(), e.source().begin.line,
              e.source().begin.column, e.description());
  }
  chain.push_back(canon);
  if (const toml::node* v = t.get("version")) {
    const auto* i = v->as_integer();
    FSDP_CHECK(i && i->get() == 1,
               "[config] {}: version: this fsdp-train reads config version 1, got {}",
               where(path, *v), i ? std::to_string(i->get()) : std::string("a non-integer"));
  }
  if (const toml::node* inc = t.get("include")) {
    std::vector<std::string> files;
    if (const auto* s = inc->as_string()) {
      files.push_back(s->get());
    } else if (const auto* a = inc->as_array()) {
      for (const toml::node& e : *a) {
        FSDP_CHECK(e.is_string(), "[config] {}: include: expected file names, got a {}",
                   where(path, e), "non-string");
        files.push_back(*e.value<std::string>());
      }
    } else {
      FSDP_FAIL("[config] {}: include: expected a file name or a list of them", where(path, *inc));
    }
    for (const std::string& f : files) {
      const fs::path p = fs::path(f).is_absolute() ? fs::path(f) : path.parent_path() / f;
      load(o, p, chain, loads, k);
    }
  }
  for (const auto& [key, node] : t) {
    const std::string name(key.str());
    if (name == "version" || name == "include") continue;
    // A quoted key may hold any character, a NUL included: messages show it escaped, never cut.
    const std::string shown = json_read::printable(name, 80);
    if (!node.is_table()) {
      std::vector<std::string> fields;
      std::string in;
      for (const auto& [s, f] : k.fields)
        if (f == name) in = s;
      FSDP_FAIL(
          "[config] {}: '{}' is outside any section; the top level holds version, include "
          "and [sections]{}",
          where(path, node), shown,
          in.empty() ? "" : fmt::format(" (did you mean [{}] {}?)", in, shown));
    }
    if (std::find(k.sections.begin(), k.sections.end(), name) == k.sections.end())
      FSDP_FAIL("[config] {}: unknown section [{}]{}; the sections are {}", where(path, node),
                shown, suggest(name, k.sections),
                fmt::format("[{}]", fmt::join(k.sections, "], [")));
    for (const auto& [fkey, value] : *node.as_table()) {
      const std::string field(fkey.str());
      std::vector<std::string> here;
      std::string elsewhere;
      for (const auto& [s, f] : k.fields) {
        if (s == name) here.push_back(f);
        else if (f == field) elsewhere = s;
      }
      if (std::find(here.begin(), here.end(), field) == here.end())
        FSDP_FAIL(
            "[config] {}: [{}] has no key '{}'{}", where(path, value), name,
            json_read::printable(field, 80),
            !elsewhere.empty() ? fmt::format(" (it is in [{}])", elsewhere) : suggest(field, here));
      std::string flag = "--" + field;
      std::replace(flag.begin(), flag.end(), '_', '-');
      const std::string text = value_text(path, fmt::format("[{}] {}", name, field), value);
      FSDP_CHECK(text.find('\0') == std::string::npos,
                 "[config] {}: [{}] {}: the value \"{}\" holds a NUL byte, which no flag takes",
                 where(path, value), name, field, json_read::printable(text, 80));
      try {
        set_flag(o, flag, text);
      } catch (const Error& e) {
        FSDP_FAIL("[config] {}: [{}] {}: {}", where(path, value), name, field,
                  without_source_place(e.what()));
      }
    }
  }
  chain.pop_back();
}
#endif

}  // namespace

bool config_files_supported() { return FSDP_HAVE_TOML != 0; }

std::string apply_checkpoint_flags(TrainOptions& o, const std::string& ckpt_dir) {
  const std::string path = checkpoint::latest(ckpt_dir);
  if (path.empty()) return "";
  const fs::path meta = fs::path(path) / "metadata.json";
  const nlohmann::json j = json_read::parse_file(meta.string(), "[config]");
  FSDP_CHECK(j.is_object(), "[config] {}: expected a JSON object, got {}", meta.string(),
             json_read::brief(j));
  const nlohmann::json* flags = nullptr;
  if (j.contains("config") && j["config"].is_object() && j["config"].contains("flags"))
    flags = &j["config"]["flags"];
  if (!flags || !flags->is_object()) return "";  // a checkpoint of a library user's trainer
  for (const auto& [flag, value] : flags->items()) {
    if (!value.is_string() || value.get<std::string>().empty()) continue;  // an unset optional
    if (flag == "--resume" || flag == "--overwrite") continue;  // this start's, not the run's
    try {
      set_flag(o, flag, value.get<std::string>());
    } catch (const Error& e) {
      fmt::print(stderr,
                 "fsdp-train: {}: the run's flag {} {} is not read by this fsdp-train ({}); "
                 "skipped\n",
                 meta.string(), flag, json_read::brief(value), without_source_place(e.what()));
    }
  }
  return path;
}

void load_config_file(TrainOptions& o, const std::string& path) {
#if FSDP_HAVE_TOML
  std::vector<fs::path> chain;
  size_t loads = 0;
  load(o, path, chain, loads, known_flags());
#else
  (void)o;
  FSDP_FAIL("[config] --config {}: this fsdp-train was built without toml++ (apt-get install "
            "libtomlplusplus-dev, then rebuild)",
            path);
#endif
}

std::string config_toml(const TrainOptions& o) {
  std::string out =
      "# fsdp-train's resolved config (--print-config); fsdp-train --config FILE reads it back\n"
      "version = 1\n";
  std::string_view section;
  visit_flags(o, [&](const FlagInfo& f, const auto& v) {
    using T = std::remove_cvref_t<decltype(v)>;
    if (f.section != section) {
      out += fmt::format("\n[{}]\n", f.section);
      section = f.section;
    }
    const std::string text = FlagValue<T>::str(v);
    if constexpr (is_optional<T>::value) {
      if (!v) {
        out += fmt::format("# {} = (unset: {})\n", f.field, f.help);
        return;
      }
      using U = typename T::value_type;
      if constexpr (std::is_arithmetic_v<U> && !std::is_same_v<U, bool>) {
        out += fmt::format("{} = {}\n", f.field, text);
        return;
      }
    } else if constexpr (std::is_same_v<T, bool>) {
      out += fmt::format("{} = {}\n", f.field, v ? "true" : "false");
      return;
    } else if constexpr (std::is_arithmetic_v<T>) {
      out += fmt::format("{} = {}\n", f.field, text);
      return;
    }
    if constexpr (!std::is_same_v<T, std::string>) {
      if (text.empty()) {  // a value that prints empty is its default: nothing set (StepRange)
        out += fmt::format("# {} = (none: {})\n", f.field, f.help);
        return;
      }
    }
    out += fmt::format("{} = {}\n", f.field, toml_string(text));
  });
  return out;
}

}  // namespace fsdp::train
