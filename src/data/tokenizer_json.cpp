// Tokenizer's readers (fsdp/data/tokenizer.h): a Hugging Face tokenizer.json (byte-level BPE, or
// SentencePiece-style BPE with byte fallback; its normalizer, pre-tokenizer, added tokens,
// post-processor and special ids, each checked and refused by field) and the byte vocabulary.
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/core/interrupt.h"
#include "src/core/json_read.h"
#include "src/data/byte_level.h"
#include "src/data/tokenizer_impl.h"

namespace fsdp::data {


using byte_level::byte_map;
using byte_level::Class;
using byte_level::classify;
using byte_level::decode_utf8;
using byte_level::kInvalid;

void Tokenizer::Impl::read_spm_shape(const nlohmann::json& norm, const nlohmann::json& pre) {
  using nlohmann::json;
  const std::string kMeta = "\u2581";
  auto is = [](const json& n, const char* type) {
    return n.is_object() && n.value("type", "") == type;
  };
  auto is_replace = [&](const json& n) {
    return is(n, "Replace") && n.contains("pattern") && n["pattern"].is_object() &&
           n["pattern"].value("String", "") == " " && n.value("content", "") == kMeta;
  };
  auto is_prepend = [&](const json& n) {
    return is(n, "Prepend") && n.value("prepend", "") == kMeta;
  };
  bool replaced = false;
  if (is_replace(norm)) {
    replaced = true;
  } else if (is(norm, "Sequence") && norm.contains("normalizers") &&
             norm["normalizers"].is_array() && norm["normalizers"].size() == 2 &&
             is_prepend(norm["normalizers"][0]) && is_replace(norm["normalizers"][1])) {
    replaced = true;
    prefix = Prefix::every;
  } else {
    FSDP_CHECK(norm.is_null(),
               "[tokenizer] {}: normalizer {} is not supported in a SentencePiece BPE "
               "(byte_fallback); expected Replace(' ', '\u2581') or Sequence [Prepend('\u2581'), "
               "Replace(' ', '\u2581')]",
               where, json_read::brief(norm, 120));
  }
  if (is(pre, "Metaspace") && !replaced) {
    FSDP_CHECK(pre.value("replacement", kMeta) == kMeta && !pre.value("split", true),
               "[tokenizer] {}: pre_tokenizer {} is not supported; expected Metaspace with "
               "replacement '\u2581' and split false",
               where, json_read::brief(pre, 120));
    const std::string scheme =
        pre.contains("prepend_scheme")
            ? pre["prepend_scheme"].get<std::string>()
            : (pre.value("add_prefix_space", true) ? std::string("always") : std::string("never"));
    FSDP_CHECK(scheme == "always" || scheme == "first" || scheme == "never",
               "[tokenizer] {}: Metaspace prepend_scheme '{}'; expected always, first or never",
               where, scheme);
    prefix = scheme == "always" ? Prefix::every : scheme == "first" ? Prefix::first : Prefix::none;
    prefix_unless_space = true;
    replaced = true;
  } else {
    const bool split_on_space = is(pre, "Split") && pre.contains("pattern") &&
                                pre["pattern"].is_object() &&
                                pre["pattern"].value("String", "") == " ";
    FSDP_CHECK(pre.is_null() || (split_on_space && replaced),
               "[tokenizer] {}: pre_tokenizer {} is not supported in a SentencePiece BPE "
               "(byte_fallback); expected none, or Metaspace without a normalizer",
               where, json_read::brief(pre, 120));
  }
  FSDP_CHECK(replaced,
             "[tokenizer] {}: a SentencePiece BPE (byte_fallback) whose spaces are never "
             "'\u2581': expected a Replace(' ', '\u2581') normalizer or a Metaspace pre_tokenizer",
             where);
}

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
  const json j = json_read::parse(text, where, "[tokenizer]");
  auto t = std::make_shared<Impl>();
  t->json_text = text;
  t->where = where;
  FSDP_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
             "[tokenizer] {}: no \"model\" object (not a Hugging Face tokenizer.json)", where);
  const json& model = j["model"];
  const std::string type = model.value("type", "");
  FSDP_CHECK(type == "BPE", "[tokenizer] {}: model type '{}' is not supported; expected BPE", where,
             type);
  json pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  t->spm = model.value("byte_fallback", false);
  if (t->spm) {
    t->read_spm_shape(j.contains("normalizer") ? j["normalizer"] : json(), pre);
  } else {
    const json norm = j.contains("normalizer") ? j["normalizer"] : json();
    t->nfc = norm.is_object() && norm.size() == 1 && norm.value("type", "") == "NFC";
    FSDP_CHECK(norm.is_null() || t->nfc,
               "[tokenizer] {}: a normalizer ({}) is not supported in a byte-level BPE; expected "
               "none or NFC",
               where, json_read::brief(norm, 80));
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
    // Llama 3's and Qwen2's: Sequence [Split(their regex, Isolated), ByteLevel without its own].
    if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
        pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2 &&
        pre["pretokenizers"][0].is_object() &&
        pre["pretokenizers"][0].value("type", "") == "Split") {
      const json& split = pre["pretokenizers"][0];
      const std::string regex = split.contains("pattern") && split["pattern"].is_object()
                                    ? split["pattern"].value("Regex", "")
                                    : "";
      t->llama3_digits = regex == kLlama3Split ? 3 : regex == kQwen2Split ? 1 : 0;
      FSDP_CHECK(t->llama3_digits > 0 && split.value("behavior", "") == "Isolated" &&
                     !split.value("invert", false),
                 "[tokenizer] {}: pre_tokenizer Split {} is not supported; expected Llama 3's or "
                 "Qwen2's regex, behavior Isolated",
                 where, json_read::brief(split, 160));
      json byte_level = pre["pretokenizers"][1];
      pre = std::move(byte_level);
      FSDP_CHECK(
          pre.is_object() && pre.value("type", "") == "ByteLevel" && !pre.value("use_regex", true),
          "[tokenizer] {}: after Llama 3's split, pre_tokenizer {} is not supported; "
          "expected ByteLevel with use_regex false",
          where, json_read::brief(pre, 80));
    } else {
      FSDP_CHECK(
          pre.is_object() && pre.value("type", "") == "ByteLevel" && pre.value("use_regex", true),
          "[tokenizer] {}: pre_tokenizer {} is not supported; expected ByteLevel with "
          "use_regex (GPT-2's split), alone or after Digits(individual_digits), or after "
          "Llama 3's or Qwen2's Split",
          where, json_read::brief(pre, 80));
    }
    t->add_prefix_space = pre.value("add_prefix_space", false);
    FSDP_CHECK(!((t->split_digits || t->llama3_digits > 0) && t->add_prefix_space),
               "[tokenizer] {}: a split then ByteLevel with add_prefix_space is not supported",
               where);
  }
  FSDP_CHECK(model.contains("vocab") && model["vocab"].is_object(),
             "[tokenizer] {}: no model.vocab", where);
  std::map<int64_t, std::string> by_id;
  std::unordered_map<std::string, int32_t> vocab_ids;  // the BPE model's own
  for (auto& [tok, id] : model["vocab"].items()) {
    FSDP_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1 << 30),
               "[tokenizer] {}: model.vocab[\"{}\"] is {}, not an id", where,
               json_read::printable(tok, 80), json_read::brief(id));
    FSDP_CHECK(tok.size() <= kMaxTokenBytes,
               "[tokenizer] {}: model.vocab's token of id {} is {} bytes long, more than the "
               "limit of {} bytes (\"{}\")",
               where, id.get<int64_t>(), tok.size(), kMaxTokenBytes, json_read::printable(tok, 40));
    by_id[id.get<int64_t>()] = tok;
    vocab_ids[tok] = int32_t(id.get<int64_t>());
  }
  std::map<int64_t, bool> special_ids;
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const json& a : j["added_tokens"]) {
      FSDP_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() &&
                     a.contains("content") && a["content"].is_string(),
                 "[tokenizer] {}: added token {} has no integer \"id\" and string \"content\"",
                 where, json_read::brief(a, 80));
      const int64_t id = a.at("id").get<int64_t>();
      const std::string content = a.at("content").get<std::string>();
      FSDP_CHECK(content.size() <= kMaxTokenBytes,
                 "[tokenizer] {}: added_tokens[{}] (id {}) is {} bytes long, more than the limit "
                 "of {} bytes (\"{}\")",
                 where, t->added.size(), id, content.size(), kMaxTokenBytes,
                 json_read::printable(content, 40));
      by_id[id] = content;
      special_ids[id] = a.value("special", false);
      // Hugging Face matches a normalized added token in the normalized text; here added tokens
      // are found in the text as it is, which is the same only without a normalizer.
      FSDP_CHECK(!t->nfc || !a.value("normalized", false),
                 "[tokenizer] {}: added token '{}' is \"normalized\": true beside the NFC "
                 "normalizer; only added tokens matched as written (normalized false) are "
                 "supported with it",
                 where, content);
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
  t->build_added_automaton();
  t->byte_ids.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = t->ids.find(t->spm ? fmt::format("<0x{:02X}>", b) : byte_to_unicode(uint8_t(b)));
    if (it != t->ids.end()) t->byte_ids[size_t(b)] = it->second;
  }
  if (t->spm) {
    if (model.contains("unk_token") && !model["unk_token"].is_null()) {
      const std::string u = model["unk_token"].get<std::string>();
      auto it = t->ids.find(u);
      FSDP_CHECK(it != t->ids.end(), "[tokenizer] {}: model.unk_token '{}' is not in model.vocab",
                 where, u);
      t->unk = it->second;
    }
    t->fuse_unk = model.value("fuse_unk", false);
  }
  if (model.contains("merges"))
    for (const json& m : model["merges"]) {
      std::pair<std::string, std::string> pair;
      if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        pair = {m[0].get<std::string>(), m[1].get<std::string>()};
      } else {
        FSDP_CHECK(m.is_string(), "[tokenizer] {}: merge {} is neither \"a b\" nor [\"a\", \"b\"]",
                   where, json_read::brief(m, 80));
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        FSDP_CHECK(sp != std::string::npos, "[tokenizer] {}: merge '{}' is not \"a b\"", where, s);
        pair = {s.substr(0, sp), s.substr(sp + 1)};
      }
      // As Hugging Face's BPE refuses on load: both sides and what they make are model tokens
      // (else encode would fail later, on the first text that reaches the merge).
      int32_t part_ids[3];
      int k = 0;
      for (const std::string& part : {pair.first, pair.second, pair.first + pair.second}) {
        auto it = vocab_ids.find(part);
        FSDP_CHECK(it != vocab_ids.end(),
                   "[tokenizer] {}: merge '{} {}' names '{}', which is not in model.vocab", where,
                   pair.first, pair.second, part);
        part_ids[k++] = it->second;
      }
      t->pair_merge.emplace(Impl::pair_key(part_ids[0], part_ids[1]),
                            std::pair{int32_t(t->merge_list.size()), part_ids[2]});
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
  // A TemplateProcessing post-processor (alone, or in a Sequence: Llama 3's) whose single-text
  // template begins with a special token: that token's id.
  const json post = j.contains("post_processor") ? j["post_processor"] : json();
  std::vector<json> processors;
  if (post.is_object() && post.value("type", "") == "Sequence" && post.contains("processors") &&
      post["processors"].is_array())
    processors.assign(post["processors"].begin(), post["processors"].end());
  else if (post.is_object())
    processors.push_back(post);
  for (const json& pp : processors) {
    if (pp.value("type", "") != "TemplateProcessing" || !pp.contains("single") ||
        !pp["single"].is_array() || pp["single"].empty() || !pp["single"][0].is_object() ||
        !pp["single"][0].contains("SpecialToken"))
      continue;
    const std::string name = pp["single"][0]["SpecialToken"].at("id").get<std::string>();
    const json& ids = pp.at("special_tokens").at(name).at("ids");
    FSDP_CHECK(ids.is_array() && ids.size() == 1 && ids[0].is_number_integer() &&
                   ids[0].get<int64_t>() >= 0 && ids[0].get<int64_t>() < int64_t(t->tokens.size()),
               "[tokenizer] {}: post_processor.special_tokens[\"{}\"].ids is {}; expected one id "
               "of the vocabulary",
               where, name, json_read::brief(ids, 80));
    t->text_prefix = int32_t(ids[0].get<int64_t>());
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

}  // namespace fsdp::data
