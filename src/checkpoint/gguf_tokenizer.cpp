// GGUF's tokenizers, llama.cpp's "gpt2" (byte-level BPE) and SentencePiece models, as
// tokenizer.json (what transformers derives from them). A family's way of spelling its
// SentencePiece vocabulary is its state-dict adapter's (gguf_spm_by_id). See
// include/fsdp/checkpoint/gguf.h.
#include <algorithm>
#include <cmath>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/core/error.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/ops/rope.h"
#include "fsdp/models/spec.h"
#include "fsdp/models/state_dict_adapter.h"
#include "src/checkpoint/gguf_format_names.h"
#include "src/data/byte_level.h"

namespace fsdp::checkpoint {

// ---------------------------------------------------------------- tokenizer

namespace {

// The byte offsets where s's code points begin, and s.size(); throws naming the token when s is
// not UTF-8.
std::vector<size_t> code_point_starts(const GgufFile& f, const std::string& s) {
  std::vector<size_t> at;
  for (size_t i = 0; i < s.size();) {
    const auto [cp, len] = data::byte_level::decode_utf8(s, i);
    FSDP_CHECK(cp != data::byte_level::kInvalid,
               "[gguf] {}: tokenizer.ggml.tokens holds '{}', which is not UTF-8", f.path(), s);
    at.push_back(i);
    i += len;
  }
  at.push_back(s.size());
  return at;
}

// Whether a family spells the vocabulary of a GGUF of architecture `arch` by id (scores by id,
// runs of spaces as spaces: its adapter's gguf_spm_by_id).
bool spm_by_id(const std::string& arch) {
  for (const models::ModelSpec* s : models::model_specs())
    if (s->adapter && s->adapter->spells_spm_by_id(arch)) return true;
  return false;
}

// The SentencePiece tokenizer.ggml.model as transformers 5 reads it (gguf.h, GgufTokenizerInfo).
std::string sentencepiece_json(const GgufFile& f, const std::vector<std::string>& tokens,
                               const std::vector<int64_t>& types,
                               const std::optional<int32_t>& unk) {
  using json = nlohmann::json;
  const bool by_id = spm_by_id(f.get_string("general.architecture", ""));
  const size_t n = tokens.size();
  std::vector<double> score(n);
  if (by_id) {
    for (size_t i = 0; i < n; ++i) score[i] = -double(i);
  } else {
    const std::vector<double>& s = f.get_floats("tokenizer.ggml.scores");
    FSDP_CHECK(s.size() == n, "[gguf] {}: tokenizer.ggml.scores has {} entries for {} tokens",
               f.path(), s.size(), n);
    score = s;
    for (size_t i = 0; i < n; ++i)  // a NaN would make the merges' order undefined
      FSDP_CHECK(!std::isnan(score[i]),
                 "[gguf] {}: tokenizer.ggml.scores[{}] is NaN; expected a "
                 "number (the token's log-probability)",
                 f.path(), i);
  }
  // A vocabulary spelled by id stores its runs of spaces as spaces; transformers spells them
  // U+2581, as the merges that reach them need.
  std::vector<std::string> spelled(tokens);
  std::vector<std::vector<size_t>> starts(n);
  for (size_t i = 0; i < n; ++i) {
    starts[i] = code_point_starts(f, tokens[i]);
    if (!by_id || tokens[i].find(' ') == std::string::npos) continue;
    bool blank = true;
    for (size_t k = 0; blank && k + 1 < starts[i].size(); ++k)
      blank = data::byte_level::python_space(
          data::byte_level::decode_utf8(tokens[i], starts[i][k]).first);
    if (!blank) continue;
    spelled[i].clear();
    for (size_t k = 0; k + 1 < starts[i].size(); ++k) spelled[i] += "\u2581";
    starts[i] = code_point_starts(f, spelled[i]);
  }
  std::unordered_map<std::string, int32_t> id_of;
  id_of.reserve(n);
  json vocab = json::object();
  for (size_t i = 0; i < n; ++i) {
    auto [it, fresh] = id_of.emplace(spelled[i], int32_t(i));
    FSDP_CHECK(fresh, "[gguf] {}: token '{}' appears twice (ids {} and {})", f.path(), spelled[i],
               it->second, i);
    vocab[spelled[i]] = int64_t(i);
  }
  // Every split of a token into two tokens, the token's best first (transformers'
  // generate_merges: by score, then the longer left part; a token's own splits by their ids).
  struct Merge {
    int32_t left, right;
    double score;
    size_t left_len, right_len;  // in code points
  };
  std::vector<Merge> merges;
  // Only splits whose both parts have the byte length of some token are looked up, so a token's
  // splits cost its length times the number of distinct token lengths, not its length squared.
  size_t longest = 0;
  for (const std::string& t : spelled) longest = std::max(longest, t.size());
  constexpr size_t kMaxMergeBytes = size_t(64) << 20;
  size_t merge_bytes = 0;
  std::vector<bool> a_length(longest + 1, false);
  for (const std::string& t : spelled) a_length[t.size()] = true;
  for (size_t i = 0; i < n; ++i) {
    const std::vector<size_t>& at = starts[i];
    const size_t first = merges.size(), cps = at.size() - 1;
    for (size_t k = 1; k < cps; ++k) {
      if (!a_length[at[k]] || !a_length[spelled[i].size() - at[k]]) continue;
      auto l = id_of.find(spelled[i].substr(0, at[k]));
      if (l == id_of.end()) continue;
      auto r = id_of.find(spelled[i].substr(at[k]));
      if (r == id_of.end()) continue;
      merges.push_back({l->second, r->second, score[i], k, cps - k});
      // Real vocabularies make a few MB of merges (a 262k-token vocabulary's); a crafted one (the
      // runs "a" to "a"*1400) would make 900 MB of them.
      merge_bytes += spelled[i].size();
      FSDP_CHECK(merge_bytes <= kMaxMergeBytes,
                 "[gguf] {}: the merges that tokenizer.ggml.tokens implies hold more than {} MiB "
                 "of text (the limit; reached at token {}): not a SentencePiece vocabulary",
                 f.path(), kMaxMergeBytes >> 20, i);
    }
    std::sort(merges.begin() + std::ptrdiff_t(first), merges.end(),
              [](const Merge& a, const Merge& b) {
                return std::pair(a.left, a.right) < std::pair(b.left, b.right);
              });
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tuple(a.score, a.left_len, a.right_len) >
           std::tuple(b.score, b.left_len, b.right_len);
  });
  json merge_list = json::array();
  for (const Merge& m : merges)
    merge_list.push_back(json::array({spelled[size_t(m.left)], spelled[size_t(m.right)]}));
  enum : int64_t { CONTROL = 3, USER_DEFINED = 4 };
  json added = json::array();
  for (int64_t type : {CONTROL, USER_DEFINED})
    for (size_t i = 0; i < n; ++i)
      // a user-defined token that the respelling renamed is matched by the merges instead
      if (types[i] == type && (type == CONTROL || spelled[i] == tokens[i]))
        added.push_back({{"id", int64_t(i)},
                         {"content", tokens[i]},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", type == CONTROL}});
  const json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  // transformers' LlamaTokenizer: Metaspace, prepend_scheme "first"; llama.cpp adds no prefix
  // space where the file says add_space_prefix false, nor does this.
  const json metaspace = {
      {"type", "Metaspace"},
      {"replacement", "\u2581"},
      {"prepend_scheme", f.get_bool("tokenizer.ggml.add_space_prefix", true) ? "first" : "never"},
      {"split", false}};
  const json decoder = {
      {"type", "Sequence"},
      {"decoders",
       json::array(
           {json{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
            json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}}})}};
  // tokenizer.ggml.add_bos_token: BOS before a text, as Hugging Face's post-processor writes it.
  json post = nullptr;
  if (const auto bos = f.has("tokenizer.ggml.bos_token_id")
                           ? std::optional<int64_t>(f.get_int("tokenizer.ggml.bos_token_id"))
                           : std::nullopt;
      bos && *bos >= 0 && *bos < int64_t(n) && f.get_bool("tokenizer.ggml.add_bos_token", false)) {
    const std::string& name = tokens[size_t(*bos)];
    const json special = {{"SpecialToken", {{"id", name}, {"type_id", 0}}}};
    post = {
        {"type", "TemplateProcessing"},
        {"single", json::array({special, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array({special,
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              special,
                              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens",
         {{name, {{"id", name}, {"ids", json::array({*bos})}, {"tokens", json::array({name})}}}}}};
  }
  const json j = {{"version", "1.0"},
                  {"truncation", nullptr},
                  {"padding", nullptr},
                  {"added_tokens", added},
                  {"normalizer", by_id ? replace : json(nullptr)},
                  {"pre_tokenizer", by_id ? json(nullptr) : metaspace},
                  {"post_processor", post},
                  {"decoder", decoder},
                  {"model",
                   {{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", unk ? json(tokens[size_t(*unk)]) : json(nullptr)},
                    {"continuing_subword_prefix", nullptr},
                    {"end_of_word_suffix", nullptr},
                    {"fuse_unk", true},
                    {"byte_fallback", true},
                    {"ignore_merges", false},
                    {"vocab", vocab},
                    {"merges", merge_list}}}};
  return j.dump();
}

}  // namespace

GgufTokenizerInfo gguf_tokenizer_info(const GgufFile& f) {
  GgufTokenizerInfo info;
  info.model = f.get_string("tokenizer.ggml.model");
  FSDP_CHECK(info.model == gguf_format::kByteLevelBpe || info.model == gguf_format::kSentencePiece,
             "[gguf] {}: tokenizer.ggml.model is '{}'; fsdp.cpp reads {}", f.path(), info.model,
             gguf_format::kTokenizerModels);
  info.pre = f.get_string("tokenizer.ggml.pre", std::string(gguf_format::kDefaultPre));
  info.chat_template = f.get_string("tokenizer.chat_template", "");
  const auto& tokens = f.get_strings("tokenizer.ggml.tokens");
  FSDP_CHECK(!tokens.empty() && tokens.size() < (size_t(1) << 31),
             "[gguf] {}: tokenizer.ggml.tokens has {} tokens", f.path(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i)
    FSDP_CHECK(tokens[i].size() <= data::kMaxTokenBytes,
               "[gguf] {}: tokenizer.ggml.tokens[{}] is {} bytes long, more than the limit of {} "
               "bytes",
               f.path(), i, tokens[i].size(), data::kMaxTokenBytes);
  std::vector<int64_t> types(tokens.size(), 1);
  if (f.has("tokenizer.ggml.token_type")) {
    types = f.get_ints("tokenizer.ggml.token_type");
    FSDP_CHECK(types.size() == tokens.size(),
               "[gguf] {}: tokenizer.ggml.token_type has {} entries for {} tokens", f.path(),
               types.size(), tokens.size());
    // llama.cpp's llama_token_type: 0 undefined, 1 normal, 2 unknown, 3 control, 4 user-defined,
    // 5 unused, 6 byte.
    for (size_t i = 0; i < types.size(); ++i)
      FSDP_CHECK(types[i] >= 0 && types[i] <= 6,
                 "[gguf] {}: tokenizer.ggml.token_type[{}] is {}; expected 0 to 6 (undefined, "
                 "normal, unknown, control, user-defined, unused, byte)",
                 f.path(), i, types[i]);
  }
  auto id = [&](const char* key) -> std::optional<int32_t> {
    if (!f.has(key)) return std::nullopt;
    const int64_t v = f.get_int(key);
    FSDP_CHECK(v >= 0 && v < int64_t(tokens.size()),
               "[gguf] {}: {} is {}, outside the vocabulary [0, {})", f.path(), key, v,
               tokens.size());
    return int32_t(v);
  };
  info.bos = id("tokenizer.ggml.bos_token_id");
  info.eos = id("tokenizer.ggml.eos_token_id");
  info.pad = id("tokenizer.ggml.padding_token_id");
  info.unk = id("tokenizer.ggml.unknown_token_id");
  info.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", false);
  info.add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);

  if (info.model == gguf_format::kSentencePiece) {
    info.tokenizer_json = sentencepiece_json(f, tokens, types, info.unk);
    return info;
  }
  // nlohmann::json's sorted maps, not ordered_json (whose lookups are linear, too slow for 50k
  // tokens): tokenizer.json readers take the ids from the values, not from the order.
  using json = nlohmann::json;
  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto [it, fresh] = vocab.emplace(tokens[i], int64_t(i));
    FSDP_CHECK(fresh, "[gguf] {}: token '{}' appears twice (ids {} and {})", f.path(), tokens[i],
               it->get<int64_t>(), i);
    enum : int64_t { CONTROL = 3, USER_DEFINED = 4 };
    if (types[i] == CONTROL || types[i] == USER_DEFINED)
      added.push_back({{"id", int64_t(i)},
                       {"content", tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", types[i] == USER_DEFINED},
                       {"special", types[i] == CONTROL}});
  }
  // A merge of letters with digits whose product is no token can never apply: every split below
  // puts letters and digits in different pieces. fsdp-export writes one ("a 1") where the
  // vocabulary has no merges, since llama.cpp refuses a "gpt2" vocabulary without any; it is
  // dropped here (Hugging Face's BPE would refuse a merge that makes no token).
  auto run_of = [](const std::string& s, bool digits) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [&](char ch) {
      return digits ? (ch >= '0' && ch <= '9')
                    : ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'));
    });
  };
  json merges = json::array();
  if (f.has("tokenizer.ggml.merges"))
    for (const std::string& m : f.get_strings("tokenizer.ggml.merges")) {
      const size_t sp = m.find(' ');
      FSDP_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < m.size(),
                 "[gguf] {}: merge '{}' is not \"a b\"", f.path(), m);
      const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
      const bool never = !vocab.contains(a + b) && ((run_of(a, false) && run_of(b, true)) ||
                                                    (run_of(a, true) && run_of(b, false)));
      if (!never) merges.push_back(json::array({a, b}));
    }
  // llama.cpp's pre-tokenizer names (gguf_format_names.h): GPT-2's split alone; every number
  // code point split off first; or a split regex before a ByteLevel without its own. Others use
  // other regexes, which our tokenizer does not have.
  const bool digits = gguf_format::splits_digits(info.pre);
  const char* const split = gguf_format::split_regex(info.pre);
  FSDP_CHECK(digits || split || gguf_format::splits_gpt2(info.pre),
             "[gguf] {}: tokenizer.ggml.pre is '{}'; fsdp.cpp splits text as {} do", f.path(),
             info.pre, gguf_format::kPreNames);
  const json byte_level = {
      {"type", "ByteLevel"},
      {"add_prefix_space", f.get_bool("tokenizer.ggml.add_space_prefix", false)},
      {"trim_offsets", true},
      {"use_regex", split == nullptr}};
  json pre = byte_level;
  if (digits)
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            json::array({json{{"type", "Digits"}, {"individual_digits", true}}, byte_level})}};
  if (split)
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            json::array(
                {json{{"type", "Split"},
                      {"pattern", {{"Regex", split}}},
                      {"behavior", "Isolated"},
                      {"invert", false}},
                 byte_level})}};
  const json j = {{"version", "1.0"},
                  {"truncation", nullptr},
                  {"padding", nullptr},
                  {"added_tokens", added},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", pre},
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
                    {"merges", merges}}}};
  try {
    info.tokenizer_json = j.dump();
  } catch (const json::exception& e) {  // a token or merge that is not UTF-8
    FSDP_FAIL("[gguf] {}: the tokenizer's tokens and merges must be valid UTF-8: {}", f.path(),
              e.what());
  }
  return info;
}

data::Tokenizer gguf_tokenizer(const GgufFile& f) {
  return data::Tokenizer::from_json(gguf_tokenizer_info(f).tokenizer_json, f.path());
}

}  // namespace fsdp::checkpoint
