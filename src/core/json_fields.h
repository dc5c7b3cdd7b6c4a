// Typed reads of the fields of a model folder's JSON files (config.json, tokenizer_config.json,
// generation_config.json, tokenizer_meta.json): a field of the wrong type names the file, the
// field and what was expected ("[hf] dir/config.json: rms_norm_eps: expected a number, got the
// string \"tiny\""), never nlohmann's "[json.exception.type_error.302] type must be number".
#pragma once

#include <stddef.h>

#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "fsdp/core/error.h"
#include "src/core/json_read.h"

namespace fsdp::json_fields {

using json = nlohmann::json;

// A value in words for a message: `the string "tiny"`, `the number 5`, `an array`, ...
inline std::string described(const json& v) {
  const std::string text = json_read::brief(v, 57);  // bounded: the value may be untrusted
  if (v.is_string()) return "the string " + text;
  if (v.is_number()) return "the number " + text;
  if (v.is_boolean()) return "the boolean " + text;
  if (v.is_null()) return "null";
  if (v.is_array()) return "the array " + text;
  return "the object " + text;
}

// Where a field is: the file (`where`, its path) and the field's name ("bos_token.content",
// "eos_token_id[0]"), with the message's source ("[hf]", "[pretrained]").
struct Field {
  const char* source;
  const std::string& where;
  std::string name;

  Field at(const std::string& key) const { return {source, where, name + "." + key}; }
  Field at(size_t i) const { return {source, where, name + "[" + std::to_string(i) + "]"}; }

  [[noreturn]] void wrong(const char* expected, const json& v) const {
    FSDP_FAIL("{} {}: {}: expected {}, got {}", source, where, name, expected, described(v));
  }
  double number(const json& v) const {
    if (!v.is_number()) wrong("a number", v);
    return v.get<double>();
  }
  int64_t integer(const json& v) const {
    if (!v.is_number_integer()) wrong("an integer", v);
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      wrong("an integer that fits in 64 bits", v);
    return v.get<int64_t>();
  }
  int32_t id(const json& v) const {  // a token id
    const int64_t i = integer(v);
    if (i < 0 || i > std::numeric_limits<int32_t>::max()) wrong("a token id (0 to 2^31-1)", v);
    return int32_t(i);
  }
  std::string string(const json& v) const {
    if (!v.is_string()) wrong("a string", v);
    return v.get<std::string>();
  }
  bool boolean(const json& v) const {
    if (!v.is_boolean()) wrong("true or false", v);
    return v.get<bool>();
  }
  const json& object(const json& v) const {
    if (!v.is_object()) wrong("an object", v);
    return v;
  }
};

// obj[key] when present and not null, else nullptr.
inline const json* member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace fsdp::json_fields
