// Byte-level BPE as Hugging Face tokenizers runs it (fsdp/data/tokenizer.h):
// added tokens first, then GPT-2's split (after each number code point is split off alone, when
// the tokenizer.json has a Digits(individual_digits) pre-tokenizer before ByteLevel), bytes ->
// GPT-2's printable code points, then the merges in rank order (the lowest rank first, the leftmost
// of equal ranks), then the vocabulary.
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
#include <sstream>
#include <unordered_map>
#include <utility>

#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "src/data/byte_level.h"

namespace fsdp::data {

namespace {

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ uint64_t(static_cast<unsigned char>(c))) * 1099511628211ull;
  return h;
}

}  // namespace

using byte_level::byte_map;
using byte_level::Class;
using byte_level::classify;
using byte_level::decode_utf8;
using byte_level::kInvalid;

struct Tokenizer::Impl {
  bool bytes = false;
  std::string json_text, where;
  std::vector<std::string> tokens;  // byte-level form, by id
  std::unordered_map<std::string, int32_t> ids;
  std::unordered_map<std::string, int32_t> ranks;  // "a b" -> rank
  std::vector<std::pair<std::string, std::string>> merge_list;
  std::vector<std::pair<std::string, int32_t>> added;  // content, id; longest first
  std::vector<bool> special;
  bool add_prefix_space = false;
  bool split_digits = false;  // a Digits(individual_digits) pre-tokenizer before ByteLevel
  std::optional<int32_t> bos, eos;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  // One pre-token (raw bytes) -> ids.
  std::vector<int32_t> bpe(std::string_view piece) const {
    if (bytes) {
      std::vector<int32_t> r;
      for (char c : piece) r.push_back(int32_t(static_cast<unsigned char>(c)));
      return r;
    }
    {
      std::lock_guard<std::mutex> lock(cache_mu);
      auto it = cache.find(std::string(piece));
      if (it != cache.end()) return it->second;
    }
    std::vector<std::string> sym;
    for (char c : piece) sym.push_back(byte_to_unicode(static_cast<unsigned char>(c)));
    while (sym.size() > 1) {
      int32_t best = -1;
      size_t at = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = ranks.find(sym[i] + " " + sym[i + 1]);
        if (it != ranks.end() && (best < 0 || it->second < best)) best = it->second, at = i;
      }
      if (best < 0) break;
      sym[at] += sym[at + 1];
      sym.erase(sym.begin() + std::ptrdiff_t(at) + 1);
    }
    std::vector<int32_t> r;
    for (const std::string& s : sym) {
      auto it = ids.find(s);
      FSDP_CHECK(it != ids.end(),
                 "[tokenizer] {}: the piece '{}' has no id (the vocabulary lacks "
                 "a byte of GPT-2's alphabet?)",
                 where, s);
      r.push_back(it->second);
    }
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() < (1u << 16)) cache.emplace(std::string(piece), r);
    return r;
  }

  void encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    std::string prefixed;
    if (add_prefix_space && !text.empty() && text[0] != ' ') {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    auto split = [&](std::string_view part) {
      for (std::string_view piece : gpt2_split(part)) {
        auto r = bpe(piece);
        out.insert(out.end(), r.begin(), r.end());
      }
    };
    if (!split_digits) return split(text);
    // Every number code point (\p{N}, Rust's is_numeric) alone, GPT-2's split between them.
    size_t run = 0;
    for (size_t i = 0; i < text.size();) {
      const auto [cp, len] = decode_utf8(text, i);
      if (cp != kInvalid && classify(cp) == Class::number) {
        split(text.substr(run, i - run));
        auto r = bpe(text.substr(i, len));
        out.insert(out.end(), r.begin(), r.end());
        run = i + len;
      }
      i += len;
    }
    split(text.substr(run));
  }
};

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::Tokenizer(const Tokenizer&) = default;
Tokenizer& Tokenizer::operator=(const Tokenizer&) = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::bytes() {
  static const std::shared_ptr<const Impl> impl = [] {
    auto t = std::make_shared<Impl>();
    t->bytes = true;
    t->where = "bytes";
    nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
    for (int b = 0; b < 256; ++b) {
      t->tokens.push_back(byte_to_unicode(uint8_t(b)));
      t->ids[t->tokens.back()] = b;
      vocab[t->tokens.back()] = b;
    }
    t->special.assign(256, false);
    const nlohmann::ordered_json byte_level = {{"type", "ByteLevel"},
                                               {"add_prefix_space", false},
                                               {"trim_offsets", true},
                                               {"use_regex", true}};
    nlohmann::ordered_json j = {{"version", "1.0"},
                                {"truncation", nullptr},
                                {"padding", nullptr},
                                {"added_tokens", nlohmann::ordered_json::array()},
                                {"normalizer", nullptr},
                                {"pre_tokenizer", byte_level},
                                {"post_processor", nullptr},
                                {"decoder", byte_level},
                                {"model",
                                 {{"type", "BPE"},
                                  {"dropout", nullptr},
                                  {"unk_token", nullptr},
                                  {"continuing_subword_prefix", nullptr},
                                  {"end_of_word_suffix", nullptr},
                                  {"fuse_unk", false},
                                  {"byte_fallback", false},
                                  {"ignore_merges", false},
                                  {"vocab", vocab},
                                  {"merges", nlohmann::ordered_json::array()}}}};
    t->json_text = j.dump(2);
    return std::shared_ptr<const Impl>(std::move(t));
  }();
  return Tokenizer(impl);
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  check_regular(path, "[tokenizer]");
  std::ifstream f(path, std::ios::binary);
  FSDP_CHECK(f.good(), "[tokenizer] cannot read '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_json(ss.str(), path);
}

// A function-try-block: the checks below name the field, and a field of a JSON type they do not
// check is named by the JSON library's exception, caught at the end, with the file.
Tokenizer Tokenizer::from_json(const std::string& text, const std::string& where) try {
  using nlohmann::json;
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    FSDP_FAIL("[tokenizer] {} is not valid JSON: {}", where, e.what());
  }
  auto t = std::make_shared<Impl>();
  t->json_text = text;
  t->where = where;
  FSDP_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
             "[tokenizer] {}: no \"model\" object (not a Hugging Face tokenizer.json)", where);
  const json& model = j["model"];
  const std::string type = model.value("type", "");
  FSDP_CHECK(type == "BPE", "[tokenizer] {}: model type '{}' is not supported; expected BPE", where,
             type);
  FSDP_CHECK(!j.contains("normalizer") || j["normalizer"].is_null(),
             "[tokenizer] {}: a normalizer ({}) is not supported; expected none", where,
             j["normalizer"].dump().substr(0, 80));
  json pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  // SmolLM2's and StarCoder's: Sequence [Digits(individual_digits), ByteLevel].
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
      pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2 &&
      pre["pretokenizers"][0].is_object() &&
      pre["pretokenizers"][0].value("type", "") == "Digits" &&
      pre["pretokenizers"][0].value("individual_digits", false) == true) {
    t->split_digits = true;
    json byte_level = pre["pretokenizers"][1];
    pre = std::move(byte_level);
  }
  FSDP_CHECK(
      pre.is_object() && pre.value("type", "") == "ByteLevel" && pre.value("use_regex", true),
      "[tokenizer] {}: pre_tokenizer {} is not supported; expected ByteLevel with "
      "use_regex (GPT-2's split), alone or after Digits(individual_digits)",
      where, pre.dump().substr(0, 80));
  t->add_prefix_space = pre.value("add_prefix_space", false);
  FSDP_CHECK(!(t->split_digits && t->add_prefix_space),
             "[tokenizer] {}: Digits then ByteLevel with add_prefix_space is not supported", where);
  FSDP_CHECK(model.contains("vocab") && model["vocab"].is_object(),
             "[tokenizer] {}: no model.vocab", where);
  std::map<int64_t, std::string> by_id;
  for (auto& [tok, id] : model["vocab"].items()) {
    FSDP_CHECK(id.is_number_integer(), "[tokenizer] {}: model.vocab[\"{}\"] is {}, not an id",
               where, tok, id.dump());
    by_id[id.get<int64_t>()] = tok;
  }
  std::map<int64_t, bool> special_ids;
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const json& a : j["added_tokens"]) {
      FSDP_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() &&
                     a.contains("content") && a["content"].is_string(),
                 "[tokenizer] {}: added token {} has no integer \"id\" and string \"content\"",
                 where, a.dump().substr(0, 80));
      const int64_t id = a.at("id").get<int64_t>();
      const std::string content = a.at("content").get<std::string>();
      by_id[id] = content;
      special_ids[id] = a.value("special", false);
      t->added.emplace_back(content, int32_t(id));
    }
  FSDP_CHECK(!by_id.empty() && by_id.begin()->first == 0 &&
                 by_id.rbegin()->first == int64_t(by_id.size()) - 1,
             "[tokenizer] {}: ids must run from 0 to {} without gaps", where,
             int64_t(by_id.size()) - 1);
  for (auto& [id, tok] : by_id) {
    t->tokens.push_back(tok);
    t->ids[tok] = int32_t(id);
    t->special.push_back(special_ids.count(id) && special_ids[id]);
  }
  std::sort(t->added.begin(), t->added.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  if (model.contains("merges"))
    for (const json& m : model["merges"]) {
      std::pair<std::string, std::string> pair;
      if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        pair = {m[0].get<std::string>(), m[1].get<std::string>()};
      } else {
        FSDP_CHECK(m.is_string(), "[tokenizer] {}: merge {} is neither \"a b\" nor [\"a\", \"b\"]",
                   where, m.dump().substr(0, 80));
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        FSDP_CHECK(sp != std::string::npos, "[tokenizer] {}: merge '{}' is not \"a b\"", where, s);
        pair = {s.substr(0, sp), s.substr(sp + 1)};
      }
      // As Hugging Face's BPE refuses on load: both sides and what they make are model tokens
      // (else encode would fail later, on the first text that reaches the merge).
      for (const std::string& part : {pair.first, pair.second, pair.first + pair.second})
        FSDP_CHECK(model["vocab"].contains(part),
                   "[tokenizer] {}: merge '{} {}' names '{}', which is not in model.vocab", where,
                   pair.first, pair.second, part);
      t->ranks.emplace(pair.first + " " + pair.second, int32_t(t->merge_list.size()));
      t->merge_list.push_back(std::move(pair));
    }
  for (auto& [content, id] : t->added) {
    if (content == "<|endoftext|>" || content == "</s>" || content == "<|eos|>" ||
        content == "<eos>")
      t->eos = id;
    if (content == "<s>" || content == "<|bos|>" || content == "<bos>" ||
        content == "<|begin_of_text|>")
      t->bos = id;
  }
  // The byte vocabulary written out (Tokenizer::bytes().json()) reads back as the bytes.
  bool is_byte_vocab = t->tokens.size() == 256 && t->merge_list.empty() && t->added.empty();
  for (size_t b = 0; is_byte_vocab && b < 256; ++b)
    is_byte_vocab = t->tokens[b] == byte_to_unicode(uint8_t(b));
  t->bytes = is_byte_vocab && !t->add_prefix_space;
  if (!t->bos && t->eos && t->tokens[size_t(*t->eos)] == "<|endoftext|>")
    t->bos = t->eos;  // GPT-2's convention: one token begins and ends a text
  return Tokenizer(std::shared_ptr<const Impl>(std::move(t)));
} catch (const nlohmann::json::exception& e) {
  FSDP_FAIL("[tokenizer] {}: a field is missing or of the wrong type: {}", where, e.what());
}

bool Tokenizer::is_bytes() const { return impl_->bytes; }
int64_t Tokenizer::size() const { return int64_t(impl_->tokens.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
const std::vector<std::string>& Tokenizer::tokens() const { return impl_->tokens; }
const std::string& Tokenizer::json() const { return impl_->json_text; }
std::string Tokenizer::hash() const { return fmt::format("{:016x}", fnv1a(impl_->json_text)); }

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
  return fmt::format("byte-level BPE, {} ids, {} merges ({})", size(), impl_->merge_list.size(),
                     impl_->where);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  size_t plain = 0, pos = 0;
  while (pos < text.size()) {  // added tokens first, longest match
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& a : impl_->added)
      if (!a.first.empty() && text.substr(pos, a.first.size()) == a.first) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++pos;
      continue;
    }
    impl_->encode_plain(text.substr(plain, pos - plain), out);
    out.push_back(hit->second);
    pos += hit->first.size();
    plain = pos;
  }
  impl_->encode_plain(text.substr(plain), out);
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  FSDP_CHECK(id >= 0 && id < size(), "[tokenizer] id {} is outside the vocabulary [0, {})", id,
             size());
  const std::string& tok = impl_->tokens[size_t(id)];
  if (impl_->special[size_t(id)]) return tok;
  std::string out;
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
  return out;
}

}  // namespace fsdp::data
