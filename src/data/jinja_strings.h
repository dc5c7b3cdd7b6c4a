// Python's str methods over UTF-8 for the Jinja engine (jinja_methods.cpp): whitespace is
// Python's, case mapping covers ASCII, Latin-1, Greek and Cyrillic (other scripts pass through).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jinja_impl.h"

namespace fsdp::data::jinja {

std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right);
std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit);
std::string upper(const std::string& s);
std::string lower(const std::string& s);
std::string capitalize(const std::string& s);
std::string title(const std::string& s);  // Jinja2's title filter (words begin after - space ( { [ <)
std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
std::string percent_format(Evaluator& ev, const std::string& fmt, const Args& a, int line);

}  // namespace fsdp::data::jinja
