// tokenizer.json from outside, and any bytes as text: the parser, then encode and decode.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "fsdp/data/tokenizer.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The bytes as text: GPT-2's split and the byte vocabulary round-trip whatever they are.
  const auto tok = fsdp::data::Tokenizer::bytes();
  if (tok.decode(tok.encode(bytes)) != bytes) __builtin_trap();
  (void)fsdp::data::gpt2_split(bytes);
  // The bytes as a tokenizer.json.
  fuzz::expect_clean("Tokenizer::from_json", [&] {
    auto t = fsdp::data::Tokenizer::from_json(std::string(bytes), "fuzz");
    const auto ids = t.encode("The license, “naïve” café 42 <|endoftext|>");
    (void)t.decode(ids, true);
  });
  return 0;
}
