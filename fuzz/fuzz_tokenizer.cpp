// tokenizer.json from outside, and any bytes as text: the parser (byte-level and SentencePiece
// BPE, an NFC normalizer), then encode and decode; the split regexes and NFC on any bytes.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/data/tokenizer.h"
#include "fuzz_common.h"
#include "src/data/byte_level.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The bytes as text: GPT-2's split and the byte vocabulary round-trip whatever they are.
  const auto tok = fsdp::data::Tokenizer::bytes();
  if (tok.decode(tok.encode(bytes)) != bytes) __builtin_trap();
  (void)fsdp::data::gpt2_split(bytes);
  // Llama 3's and Qwen2's splits cover the text, in order, whatever it is.
  for (int digits : {3, 1}) {
    size_t at = 0;
    for (std::string_view piece : fsdp::data::llama3_split(bytes, digits)) {
      if (piece.empty() || piece.data() != bytes.data() + at) __builtin_trap();
      at += piece.size();
    }
    if (at != bytes.size()) __builtin_trap();
  }
  // NFC of any bytes is NFC's fixed point (and keeps what is not UTF-8).
  const std::string composed = fsdp::data::byte_level::nfc(bytes);
  if (fsdp::data::byte_level::nfc(composed) != composed) __builtin_trap();
  // The bytes as a tokenizer.json.
  fuzz::expect_clean("Tokenizer::from_json", [&] {
    auto t = fsdp::data::Tokenizer::from_json(std::string(bytes), "fuzz");
    const auto ids = t.encode("The license, “naïve” café 42 <|endoftext|>  \n\x01\xff");
    (void)t.decode(ids, true);
  });
  return 0;
}
