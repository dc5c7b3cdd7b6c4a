// Text <-> token ids, the same ids Hugging Face's tokenizers gives:
//   - bytes(): the byte vocabulary (id = byte value), prepare_text.py's default;
//   - from_file(): a tokenizer.json with a BPE model, of one of two kinds:
//     - byte-level (GPT-2's, SmolLM2's, Qwen's, as `prepare_text.py --tokenizer bpe` trains
//       it): Hugging Face tokenizers' ByteLevel pre-tokenizer with GPT-2's split regex and no
//       prefix space, alone or after Digits(individual_digits) (SmolLM2's and StarCoder's: each
//       number code point alone first). Every token is a byte string written with GPT-2's
//       byte-to-unicode map (a space is "Ġ"), as Hugging Face and llama.cpp's "gpt2" model
//       store them;
//     - SentencePiece-style (Gemma's, Llama 2's): byte_fallback, a space written U+2581 by a
//       Replace normalizer (with a Prepend for Llama 2) or a Metaspace pre-tokenizer, each text
//       between added tokens one piece, a character that is no token its <0xXX> byte tokens.
//     Added tokens are matched first, the longest at the leftmost place. Any text encodes, and
//     decode(encode(text)) == text (less the prefix space a SentencePiece one adds).
//   A GGUF's tokenizer (llama.cpp's "gpt2" and "llama" models) is read as the tokenizer.json
//   that transformers derives from it (checkpoint::gguf_tokenizer).
//
//   auto tok = data::Tokenizer::from_file("data/tokenizer.json");
//   std::vector<int32_t> ids = tok.encode("The license");
//   std::string text = tok.decode(ids);
#pragma once

#include <cstddef>
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
  // Throws, naming the file and the field, for a tokenizer.json of neither kind.
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json(const std::string& json, const std::string& where = "tokenizer.json");

  bool is_bytes() const;
  bool is_sentencepiece() const;  // byte_fallback over characters, spaces as U+2581
  bool prefixes_space() const;    // a SentencePiece one that puts "▁" before the text
  int64_t size() const;  // ids in the vocabulary: 256 for bytes
  std::vector<int32_t> encode(std::string_view text) const;
  // Special tokens (BOS, EOS, other added ones) are left out unless keep_special.
  std::string decode(const std::vector<int32_t>& ids, bool keep_special = false) const;
  std::string token_bytes(int32_t id) const;  // what one id stands for, as bytes
  std::optional<int32_t> bos_id() const;
  // The token the file's post-processor puts before a text (a TemplateProcessing that begins
  // with one: Gemma's and Llama's BOS); encode() never adds it, callers that frame a text do.
  std::optional<int32_t> text_prefix_id() const;
  std::optional<int32_t> eos_id() const;
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;  // one of the file's added tokens (special or not)

  // The vocabulary as the tokenizer.json spells it (GPT-2's byte-level form, or SentencePiece's
  // with U+2581), by id, and the merges ("a b", by rank).
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

// The byte a SentencePiece byte token stands for ("<0x0A>" is 10), or -1 for any other token.
int byte_token_value(const std::string& token);

// GPT-2's byte <-> unicode map: byte b as the UTF-8 of one printable code point.
std::string byte_to_unicode(uint8_t b);
// GPT-2's pre-tokenizer split ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
// \s+(?!\S)|\s+) on UTF-8 text; invalid UTF-8 bytes count as non-letters.
std::vector<std::string_view> gpt2_split(std::string_view text);
// Llama 3's split ((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+), and with max_digits 1 Qwen2's and 3's.
std::vector<std::string_view> llama3_split(std::string_view text, int max_digits = 3);
// Those regexes as Hugging Face's tokenizer.json writes them (a Split pre-tokenizer's "Regex").
extern const char* const kLlama3Split;
extern const char* const kQwen2Split;
// The longest vocabulary or added token read (tokenizer.json, a GGUF's tokenizer.ggml.tokens):
// real ones are under a few hundred bytes; a longer one is refused by name, so that no table
// built from the tokens costs more than this per token.
inline constexpr size_t kMaxTokenBytes = size_t(64) << 10;

}  // namespace fsdp::data
