// llama.cpp's names of tokenizer formats in a GGUF file (tokenizer.ggml.model, tokenizer.ggml.pre),
// in one place. Several are spelled after the model that introduced the format: "llama" is
// SentencePiece BPE, "llama-bpe" and "qwen2" are split regexes. They name formats, not model
// families: a file of any family may use any of them, and the checkpoint layer names no family.
// Private to src/checkpoint/.
#pragma once

#include <string>
#include <string_view>

#include "fsdp/data/tokenizer.h"

namespace fsdp::checkpoint::gguf_format {

// tokenizer.ggml.model: byte-level BPE, and SentencePiece BPE (scores in the merges' order).
inline constexpr std::string_view kByteLevelBpe = "gpt2";
inline constexpr std::string_view kSentencePiece = "llama";  // llama.cpp's SentencePiece format
// The tokenizer.ggml.model values read, for messages.
inline constexpr std::string_view kTokenizerModels =
    "\"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece BPE)";

// tokenizer.ggml.pre: GPT-2's split alone (the name written, and another spelling of it read), and
// llama.cpp's default when the key is absent.
inline constexpr std::string_view kGpt2Split = "gpt-2";
inline bool splits_gpt2(std::string_view pre) { return pre == kGpt2Split || pre == "gpt2"; }
inline constexpr std::string_view kDefaultPre = "default";
// Every number code point split off first (Hugging Face: Digits(individual_digits), then
// ByteLevel); the first name is the one written.
inline bool splits_digits(std::string_view pre) {
  return pre == "smollm" || pre == "starcoder" || pre == "refact";
}
inline constexpr std::string_view kDigitsPre = "smollm";

// A split regex before a ByteLevel without its own, as transformers maps llama.cpp's
// pre-tokenizer names: the regex of `pre`, or nullptr for none of them.
inline const char* split_regex(std::string_view pre) {
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "smaug-bpe")
    return data::kLlama3Split;  // format "llama-bpe"
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return data::kQwen2Split;  // format "qwen2"
  return nullptr;
}
// The name written for a split regex ("" for another regex).
inline std::string_view split_pre_name(std::string_view regex) {
  if (regex == data::kLlama3Split) return "llama-bpe";  // a split regex's format name
  if (regex == data::kQwen2Split) return "qwen2";        // a split regex's format name
  return "";
}
// The tokenizer.ggml.pre names read, for messages.
inline constexpr std::string_view kPreNames =
    "\"gpt-2\", \"smollm\", \"starcoder\", \"refact\", \"llama-bpe\" and \"qwen2\"";

}  // namespace fsdp::checkpoint::gguf_format
