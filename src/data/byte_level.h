// GPT-2's byte-level pre-tokenization, as Hugging Face tokenizers' ByteLevel runs it: UTF-8
// decoding that refuses what is not UTF-8, the letter/number/space classes of its split regex
// (Unicode's tables, unicode_tables.inc), and the map from bytes to printable code points.
// gpt2_split and byte_to_unicode (fsdp/data/tokenizer.h) are built on these; the tokenizer uses
// them to split digits and to read tokens back into bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace fsdp::data::byte_level {

// The class of a code point in GPT-2's split: \p{L}, \p{N}, \s, or anything else.
enum class Class { letter, number, space, other };
Class classify(char32_t c);

// Python's str.isspace (Jinja's trim, transformers' tests of a token's spaces): Unicode's
// White_Space and the four separators U+001C to U+001F.
bool python_space(char32_t c);

constexpr char32_t kInvalid = 0xFFFFFFFF;  // a byte that starts no valid UTF-8 sequence

// The code point at s[i] and its length in bytes; {kInvalid, 1} where no valid UTF-8 sequence
// starts: a continuation byte, C0, C1 or F5-FF, a truncated sequence, an overlong form, a UTF-16
// surrogate or a code point above U+10FFFF.
std::pair<char32_t, size_t> decode_utf8(std::string_view s, size_t i);

// Appends the UTF-8 bytes of cp.
void append_utf8(std::string& out, char32_t cp);

// Unicode's NFC of s (src/data/nfc.cpp): canonical decomposition, ordering and composition, as
// Hugging Face tokenizers' NFC normalizer. Bytes that are no UTF-8 stay as they are, each ending
// the run of text around it.
std::string nfc(std::string_view s);

// GPT-2's map: the printable bytes stand for themselves, the other 68 take code points 256...
struct ByteMap {
  std::array<char32_t, 256> to_cp{};
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap() {
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_cp[size_t(b)] = printable(b) ? char32_t(b) : next++;
      to_byte[to_cp[size_t(b)]] = uint8_t(b);
    }
  }
};
const ByteMap& byte_map();

}  // namespace fsdp::data::byte_level
