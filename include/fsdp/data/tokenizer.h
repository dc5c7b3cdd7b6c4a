// Text <-> token ids, the same ids Hugging Face's tokenizers gives:
//   - bytes(): the byte vocabulary (id = byte value), prepare_text.py's default;
//   - from_file(): a tokenizer.json with a byte-level BPE model, as
//     `prepare_text.py --tokenizer bpe` trains it (Hugging Face tokenizers'
//     ByteLevel pre-tokenizer, GPT-2's split regex, no prefix space), or with
//     SmolLM2's and StarCoder's Sequence [Digits(individual_digits), ByteLevel]
//     (each number code point alone first).
// Both are GPT-2-style byte-level vocabularies: every token is a byte string,
// written with GPT-2's byte-to-unicode map (a space is "Ġ"), which is how
// Hugging Face and llama.cpp's "gpt2" model store them; any text encodes, and
// decode(encode(text)) == text.
//
//   auto tok = data::Tokenizer::from_file("data/tokenizer.json");
//   std::vector<int32_t> ids = tok.encode("The license");
//   std::string text = tok.decode(ids);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::data {

class Tokenizer {
 public:
  static Tokenizer bytes();
  // Throws, naming the file and the field, for anything but a byte-level BPE tokenizer.json.
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json(const std::string& json, const std::string& where = "tokenizer.json");

  bool is_bytes() const;
  int64_t size() const;  // ids in the vocabulary: 256 for bytes
  std::vector<int32_t> encode(std::string_view text) const;
  // Special tokens (BOS, EOS, other added ones) are left out unless keep_special.
  std::string decode(const std::vector<int32_t>& ids, bool keep_special = false) const;
  std::string token_bytes(int32_t id) const;  // what one id stands for, as bytes
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  bool is_special(int32_t id) const;

  // The vocabulary in GPT-2's byte-level form, by id, and the merges ("a b", by rank): what a
  // GGUF "gpt2" tokenizer and Hugging Face's tokenizer.json hold.
  const std::vector<std::string>& tokens() const;
  std::vector<std::string> merges() const;
  // tokenizer.json's text: the file's own for from_file(); for bytes(), an equivalent BPE
  // with the 256 byte tokens and no merges.
  const std::string& json() const;
  std::string hash() const;  // FNV-1a 64 of json(), hex: recorded in checkpoints
  std::string describe() const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&);
  Tokenizer& operator=(const Tokenizer&);
  ~Tokenizer();

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

// GPT-2's byte <-> unicode map: byte b as the UTF-8 of one printable code point.
std::string byte_to_unicode(uint8_t b);
// GPT-2's pre-tokenizer split ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
// \s+(?!\S)|\s+) on UTF-8 text; invalid UTF-8 bytes count as non-letters.
std::vector<std::string_view> gpt2_split(std::string_view text);

}  // namespace fsdp::data
