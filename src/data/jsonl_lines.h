// The JSONL readers' shared parts (private to src/data): the file's lines with their numbers, a
// JSON value's kind for messages, and a list of chat messages checked field by field. The sample
// reader (samples.cpp) and the preference-pair reader (preference.cpp) refuse bad lines alike,
// naming the file, the line and the field.
#pragma once

#include <fmt/core.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "fsdp/core/error.h"
#include "fsdp/data/chat.h"
#include "src/data/data_files.h"

namespace fsdp::data {

// A JSON value's kind, for messages: "a string", "a number", ...
std::string kind_of(const nlohmann::json& v);

// `field` of line `line_no`: a non-empty array of {"role", "content"} messages (system, user or
// assistant; a system turn only first).
Conversation messages_of(const std::string& path, int64_t line_no, const nlohmann::json& ms,
                         const std::string& field);

// Calls f(line_no, line) for the file's non-empty lines; refuses a file with none.
template <typename F>
void for_each_line(const std::string& path, F&& f) {
  check_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  const int err = errno;
  FSDP_CHECK(in.good(), "[data] cannot read {}: {}", path, std::strerror(err));
  std::string line;
  int64_t line_no = 0, seen = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    f(line_no, line);
    ++seen;
  }
  FSDP_CHECK(seen > 0, "[data] {} has no samples (no non-empty line); expected one JSON object "
             "per line", path);
}

}  // namespace fsdp::data
