// Tokenizer (fsdp/data/tokenizer.h), the handle: its accessors, encode (the added tokens found,
// the text between them through the BPE engine of tokenizer_bpe.cpp, with a cache of pieces) and
// decode. The readers of tokenizer.json and of the byte vocabulary are tokenizer_json.cpp; the
// state they fill is Tokenizer::Impl (tokenizer_impl.h).
#include "fsdp/data/tokenizer.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <exception>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/core/interrupt.h"
#include "src/core/json_read.h"
#include "src/data/byte_level.h"
#include "src/data/tokenizer_impl.h"

namespace fsdp::data {

namespace {

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ uint64_t(static_cast<unsigned char>(c))) * 1099511628211ull;
  return h;
}

}  // namespace

int byte_token_value(const std::string& token) {
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  const int hi = hex(token[3]), lo = hex(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

using byte_level::byte_map;
using byte_level::Class;
using byte_level::classify;
using byte_level::decode_utf8;
using byte_level::kInvalid;

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::Tokenizer(const Tokenizer&) = default;
Tokenizer& Tokenizer::operator=(const Tokenizer&) = default;
Tokenizer::~Tokenizer() = default;

bool Tokenizer::is_bytes() const { return impl_->bytes; }
int64_t Tokenizer::size() const { return int64_t(impl_->tokens.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::text_prefix_id() const { return impl_->text_prefix; }
const std::vector<std::string>& Tokenizer::tokens() const { return impl_->tokens; }
const std::string& Tokenizer::json() const { return impl_->json_text; }
std::string Tokenizer::hash() const { return fmt::format("{:016x}", fnv1a(impl_->json_text)); }

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < size() &&
         std::any_of(impl_->added.begin(), impl_->added.end(),
                     [&](const auto& a) { return a.second == id; });
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < size() && impl_->special[size_t(id)];
}

std::vector<std::string> Tokenizer::merges() const {
  std::vector<std::string> out;
  for (auto& [a, b] : impl_->merge_list) out.push_back(a + " " + b);
  return out;
}

std::string Tokenizer::describe() const {
  if (is_bytes()) return "bytes (256 ids)";
  return fmt::format("{}, {} ids, {} merges ({})",
                     impl_->spm ? "SentencePiece BPE (byte fallback)" : "byte-level BPE", size(),
                     impl_->merge_list.size(), impl_->where);
}

bool Tokenizer::is_sentencepiece() const { return impl_->spm; }
bool Tokenizer::prefixes_space() const { return impl_->prefix != Impl::Prefix::none; }

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  size_t plain = 0, pos = 0;
  std::vector<int32_t> starts;  // starts[i]: text[base + i]'s added token (Impl::added_starts)
  size_t base = 0;
  while (pos < text.size()) {  // added tokens first, the longest at the leftmost place
    if (pos - base >= starts.size()) {  // the next window; a long text can be stopped between
      throw_if_interrupted("tokenizing a text");
      base = pos;
      starts = impl_->added_starts(text, base);
      if (starts.empty()) break;  // no added tokens
    }
    if (starts[pos - base] < 0) {
      ++pos;
      continue;
    }
    const auto& [content, id] = impl_->added[size_t(starts[pos - base])];
    impl_->encode_plain(text.substr(plain, pos - plain), plain == 0, out);
    out.push_back(id);
    pos += content.size();
    plain = pos;
  }
  impl_->encode_plain(text.substr(plain), plain == 0, out);
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  FSDP_CHECK(id >= 0 && id < size(), "[tokenizer] id {} is outside the vocabulary [0, {})", id,
             size());
  const std::string& tok = impl_->tokens[size_t(id)];
  if (impl_->special[size_t(id)]) return tok;
  std::string out;
  if (impl_->spm) {  // <0xXX> is its byte, U+2581 a space
    if (const int b = byte_token_value(tok); b >= 0 && impl_->byte_ids[size_t(b)] == id)
      return std::string(1, char(b));
    const std::string_view meta = "\u2581";
    for (size_t i = 0; i < tok.size();) {
      if (std::string_view(tok).substr(i, meta.size()) == meta) {
        out += ' ';
        i += meta.size();
      } else {
        out += tok[i++];
      }
    }
    return out;
  }
  const auto& to_byte = byte_map().to_byte;
  for (size_t i = 0; i < tok.size();) {
    auto [cp, len] = decode_utf8(tok, i);
    auto it = to_byte.find(cp);
    if (it != to_byte.end())
      out.push_back(char(it->second));
    else
      out.append(tok, i, len);  // not byte-level (an added token): as it is
    i += len;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool keep_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (!keep_special && is_special(id)) continue;
    out += token_bytes(id);
  }
  // The "▁" a SentencePiece tokenizer put before the text (Hugging Face's decoders strip it).
  if (impl_->spm && impl_->prefix != Impl::Prefix::none && !out.empty() && out[0] == ' ')
    out.erase(0, 1);
  return out;
}

}  // namespace fsdp::data
