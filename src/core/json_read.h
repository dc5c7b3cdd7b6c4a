// The one reading path for JSON the project did not write itself: a model folder's config.json,
// generation_config.json, tokenizer.json and tokenizer_config.json, a chat JSONL row, a
// checkpoint's metadata.json. Such text is refused by name above a size limit and above 512
// levels of nesting (as other parsers do). nlohmann's parser itself is iterative, but what the
// code does with the value afterwards (copies, dump(), comparisons) recurses once per level, so a
// value 200,000 levels deep would overflow the stack there; the depth is therefore checked by a
// linear scan of the brackets outside strings, before nlohmann builds anything.
// brief() is the bounded form of a value for an error message: never the whole of it, never
// deeper than its length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace fsdp::json_read {

inline constexpr int kMaxDepth = 512;
// A tokenizer.json (the largest file of a model folder read as JSON: Gemma 3's is 33 MB).
inline constexpr uint64_t kMaxBytes = uint64_t(256) << 20;
// config.json, generation_config.json, tokenizer_config.json, a checkpoint's metadata, a chat row.
inline constexpr uint64_t kSmallMaxBytes = uint64_t(64) << 20;

// Throws fsdp::Error "<source> <where>: ..." when text is larger than max_bytes, nests deeper
// than kMaxDepth (naming the line, column and the field's path there), or is not valid JSON.
nlohmann::json parse(std::string_view text, const std::string& where, const char* source,
                     uint64_t max_bytes = kMaxBytes);
// Reads the regular file `path` (refused above max_bytes before it is read) and parses it.
nlohmann::json parse_file(const std::string& path, const char* source,
                          uint64_t max_bytes = kMaxBytes);
// The depth check alone: an empty string when text nests at most kMaxDepth levels, else the
// message's tail ("nests deeper than 512 levels at line 1, column 513 (field a.b[0][0]...)").
std::string depth_error(std::string_view text);

// At most max_chars characters of v's JSON text ("..." at the end when cut); bytes that are not
// UTF-8 are written as U+FFFD. Recurses at most max_chars levels.
std::string brief(const nlohmann::json& v, size_t max_chars = 80);
// A string of unknown bytes for a message: printable ASCII and UTF-8 kept, other bytes as \xNN,
// cut at max_chars.
std::string printable(std::string_view s, size_t max_chars = 200);
// s itself when it is UTF-8, else s with each byte that is not part of a UTF-8 character written
// as the four characters \xNN: for a path, prompt or template the user gave (a Linux file name
// may hold any byte but '/' and NUL) that goes into a JSON file, which holds only UTF-8.
std::string utf8_safe(std::string_view s);
bool is_utf8(std::string_view s);

}  // namespace fsdp::json_read
