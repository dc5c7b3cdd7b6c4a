// data::Tokenizer (src/data/tokenizer.cpp) on inputs whose ids follow by hand: the byte
// vocabulary, GPT-2's byte map and split, a small byte-level BPE tokenizer.json written here (its
// merges say what each string encodes to), added and special tokens, the Digits pre-tokenizer,
// hashes, and the refusals of files it cannot read. tokenizer_test.py compares the same code with
// Hugging Face tokenizers on a trained vocabulary.
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/data/tokenizer.h"
#include "test_util.h"

namespace fsdp::data {
namespace {

using json = nlohmann::ordered_json;
using Ids = std::vector<int32_t>;

using fsdp::test::error_of;

#define EXPECT_MENTIONS(text, part)                          \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "'" << (part) << "' not in: " << (text)

std::string G(const std::string& s) {  // a string in GPT-2's byte-level form
  std::string out;
  for (char c : s) out += byte_to_unicode(static_cast<uint8_t>(c));
  return out;
}

// The 256 byte tokens (id = byte value), then one token per merge, then the added tokens.
// Merge ranks follow the list's order.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"},       // 0: he     256
    {"l", "l"},       // 1: ll     257
    {"he", "ll"},     // 2: hell   258
    {"hell", "o"},    // 3: hello  259
    {G(" "), "w"},    // 4: " w"   260
    {"o", "r"},       // 5: or     261
    {G(" w"), "or"},  // 6: " wor" 262
    {"l", "o"},       // 7: lo     263
    {"e", "l"},       // 8: el     264
    {"1", "2"},       // 9: 12     265
};
constexpr int32_t kHello = 259, kSpaceW = 260, kSpaceWor = 262, kLL = 257, kLo = 263, k12 = 265,
                  kEot = 266;

json tokenizer_json(json pre_tokenizer = {{"type", "ByteLevel"},
                                          {"add_prefix_space", false},
                                          {"trim_offsets", true},
                                          {"use_regex", true}},
                    bool merges_as_pairs = false,
                    json added = json::array({{{"id", kEot},
                                               {"content", "<|endoftext|>"},
                                               {"single_word", false},
                                               {"lstrip", false},
                                               {"rstrip", false},
                                               {"normalized", false},
                                               {"special", true}}})) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(uint8_t(b))] = b;
  json merges = json::array();
  int32_t id = 256;
  for (const auto& [a, b] : kMerges) {
    vocab[a + b] = id++;
    merges.push_back(merges_as_pairs ? json::array({a, b}) : json(a + " " + b));
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

class TokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/tokenizer_unit_test_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string write(const std::string& name, const json& j) const { return write(name, j.dump(2)); }
  std::string dir_;
};

// Every byte value once, 0x00 and 0xFF included, then invalid UTF-8 and text.
std::string all_bytes() {
  std::string s;
  for (int b = 0; b < 256; ++b) s.push_back(char(b));
  const char tail[] = {'\xFF', '\xFE', '\0', '\x80', ' ', 't', 'a', 'i', 'l', '\xC3', '\0'};
  return s.append(tail, sizeof tail);
}

TEST(TokenizerBytes, EveryByteIsItsOwnIdAndRoundTrips) {
  const Tokenizer t = Tokenizer::bytes();
  EXPECT_TRUE(t.is_bytes());
  EXPECT_EQ(t.size(), 256);
  EXPECT_EQ(t.tokens().size(), 256u);
  EXPECT_TRUE(t.merges().empty());
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_FALSE(t.eos_id().has_value());
  EXPECT_EQ(t.describe(), "bytes (256 ids)");
  const std::string s = all_bytes();
  const Ids ids = t.encode(s);
  ASSERT_EQ(ids.size(), s.size());
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(ids[i], int32_t(static_cast<uint8_t>(s[i])));
  EXPECT_EQ(t.decode(ids), s);
  EXPECT_EQ(t.token_bytes(0), std::string(1, '\0'));
  EXPECT_EQ(t.token_bytes(255), "\xFF");
  for (int32_t id = 0; id < 256; ++id) EXPECT_FALSE(t.is_special(id));
  EXPECT_TRUE(t.encode("").empty());
  EXPECT_EQ(t.decode({}), "");
  EXPECT_MENTIONS(error_of([&] { t.token_bytes(256); }), "id 256");
  EXPECT_MENTIONS(error_of([&] { t.token_bytes(-1); }), "id -1");
}

TEST(TokenizerBytes, ItsJsonReadsBackAsTheBytes) {
  const Tokenizer t = Tokenizer::bytes();
  const auto j = nlohmann::json::parse(t.json());
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["model"]["vocab"].size(), 256u);
  EXPECT_EQ(j["model"]["vocab"][byte_to_unicode(' ')], 32);
  const Tokenizer back = Tokenizer::from_json(t.json());
  EXPECT_TRUE(back.is_bytes());
  EXPECT_EQ(back.hash(), t.hash());
  EXPECT_EQ(back.encode(all_bytes()), t.encode(all_bytes()));
}

TEST(Tokenizer, Gpt2ByteMap) {
  // Printable bytes stand for themselves; the 68 others take U+0100 on, in byte order:
  // 0x00-0x20 are the first 33, 0x7F-0xA0 the next 34, 0xAD the last.
  EXPECT_EQ(byte_to_unicode('A'), "A");
  EXPECT_EQ(byte_to_unicode('~'), "~");
  EXPECT_EQ(byte_to_unicode(0x00), "\u0100");
  EXPECT_EQ(byte_to_unicode(' '), "\u0120");  // "Ġ"
  EXPECT_EQ(byte_to_unicode('\n'), "\u010A");
  EXPECT_EQ(byte_to_unicode(0x7F), "\u0121");
  EXPECT_EQ(byte_to_unicode(0xA0), "\u0142");
  EXPECT_EQ(byte_to_unicode(0xA1), "\u00A1");
  EXPECT_EQ(byte_to_unicode(0xAD), "\u0143");  // the 68th
  EXPECT_EQ(byte_to_unicode(0xFF), "\u00FF");
}

using Pieces = std::vector<std::string_view>;

TEST(Tokenizer, Gpt2Split) {
  EXPECT_EQ(gpt2_split("Hello world's 123  foo!!"),
            (Pieces{"Hello", " world", "'s", " 123", " ", " foo", "!!"}));
  EXPECT_EQ(gpt2_split("I'll ve'd 'x"), (Pieces{"I", "'ll", " ve", "'d", " '", "x"}));
  EXPECT_EQ(gpt2_split("a\n\nb  "), (Pieces{"a", "\n", "\n", "b", "  "}));
  EXPECT_EQ(gpt2_split(" \tx"), (Pieces{" ", "\t", "x"}));
  EXPECT_EQ(gpt2_split("naïve 日本語 x²"), (Pieces{"naïve", " 日本語", " x", "²"}));
  EXPECT_TRUE(gpt2_split("").empty());
}

TEST(Tokenizer, Gpt2SplitTakesInvalidUtf8AsNonLetters) {
  // Bytes that start no valid UTF-8 sequence are non-letters, one code point each.
  EXPECT_EQ(gpt2_split("a\xFF"
                       "b"),
            (Pieces{"a", "\xFF", "b"}));
  // 0xF8-0xFF start no sequence: F8 80 80 is three invalid bytes, not a letter (as U+8000).
  EXPECT_EQ(gpt2_split("a\xF8\x80\x80"), (Pieces{"a", "\xF8\x80\x80"}));
  // An overlong space (E0 80 A0) is no space: two of them are one run of non-letters.
  EXPECT_EQ(gpt2_split("a\xE0\x80\xA0\xE0\x80\xA0"
                       "b"),
            (Pieces{"a", "\xE0\x80\xA0\xE0\x80\xA0", "b"}));
  // A UTF-16 surrogate (ED A0 80) and a code point above U+10FFFF (F4 90 80 80) are invalid.
  EXPECT_EQ(gpt2_split("1\xED\xA0\x80"), (Pieces{"1", "\xED\xA0\x80"}));
  EXPECT_EQ(gpt2_split("x\xF4\x90\x80\x80"), (Pieces{"x", "\xF4\x90\x80\x80"}));
  // Valid 2-, 3- and 4-byte letters still count as letters.
  EXPECT_EQ(gpt2_split("a\xC3\xA9\xE8\x80\x80\xF0\x90\x80\x80 b"),
            (Pieces{"a\xC3\xA9\xE8\x80\x80\xF0\x90\x80\x80", " b"}));
}

TEST_F(TokenizerFiles, MergesGiveTheIdsTheyImply) {
  const std::string path = write("tokenizer.json", tokenizer_json());
  const Tokenizer t = Tokenizer::from_file(path);
  EXPECT_FALSE(t.is_bytes());
  EXPECT_EQ(t.size(), 256 + int64_t(kMerges.size()) + 1);
  EXPECT_EQ(t.tokens()[kHello], "hello");
  EXPECT_EQ(t.tokens()[kSpaceW], "\u0120w");
  ASSERT_EQ(t.merges().size(), kMerges.size());
  EXPECT_EQ(t.merges()[4], "\u0120 w");
  EXPECT_EQ(t.describe(), "byte-level BPE, 267 ids, 10 merges (" + path + ")");
  EXPECT_EQ(t.json(), tokenizer_json().dump(2));

  // "hello": he (rank 0), ll (1), hell (2), hello (3). " world": " w" (4), or (5), " wor" (6),
  // then nothing joins " wor" l d.
  EXPECT_EQ(t.encode("hello"), (Ids{kHello}));
  EXPECT_EQ(t.encode("hello world"), (Ids{kHello, kSpaceWor, 'l', 'd'}));
  EXPECT_EQ(t.encode(" w"), (Ids{kSpaceW}));
  // The lowest rank first, not the leftmost pair: "ell" takes ll (1) before el (8).
  EXPECT_EQ(t.encode("ell"), (Ids{'e', kLL}));
  // Of equal ranks, the leftmost: "lll" is ll l.
  EXPECT_EQ(t.encode("lll"), (Ids{kLL, 'l'}));
  EXPECT_EQ(t.encode("lo"), (Ids{kLo}));
  EXPECT_EQ(t.encode("llo"), (Ids{kLL, 'o'}));
  // Merges apply within a pre-token only: "he" and "llo" are split by the space.
  EXPECT_EQ(t.encode("he llo"), (Ids{256, ' ', kLL, 'o'}));
  // Without a Digits pre-tokenizer a number is one pre-token: " 123" is " " 12 3.
  EXPECT_EQ(t.encode(" 123"), (Ids{' ', k12, '3'}));
  // No merge: the bytes.
  EXPECT_EQ(t.encode("\n\xFF"), (Ids{'\n', 0xFF}));
  EXPECT_EQ(t.token_bytes(kSpaceWor), " wor");
  EXPECT_EQ(t.decode({kHello, kSpaceWor, 'l', 'd'}), "hello world");

  for (const std::string& s :
       {std::string("hello world, hello hell"), std::string("  lll\tell\n\n12 123 x12"),
        std::string("naïve café 日本語 ² 🙂"), all_bytes(), std::string()})
    EXPECT_EQ(t.decode(t.encode(s)), s) << s;

  // merges as ["a", "b"] pairs (tokenizers >= 0.20) read the same.
  const Tokenizer pairs = Tokenizer::from_file(
      write("pairs.json",
            tokenizer_json(
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}, true)));
  EXPECT_EQ(pairs.merges(), t.merges());
  EXPECT_EQ(pairs.encode("hello world ell lll"), t.encode("hello world ell lll"));
}

TEST_F(TokenizerFiles, AddedAndSpecialTokens) {
  const Tokenizer t = Tokenizer::from_file(write("tokenizer.json", tokenizer_json()));
  // GPT-2's convention: <|endoftext|> ends a text and, with no BOS of its own, begins one.
  EXPECT_EQ(t.eos_id(), std::optional<int32_t>(kEot));
  EXPECT_EQ(t.bos_id(), std::optional<int32_t>(kEot));
  EXPECT_TRUE(t.is_special(kEot));
  EXPECT_FALSE(t.is_special(kHello));
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_FALSE(t.is_special(int32_t(t.size())));
  // An added token is matched before the split and the merges, wherever it is.
  const std::string text = "hello<|endoftext|>hello world<|endoftext|>";
  const Ids ids = t.encode(text);
  EXPECT_EQ(ids, (Ids{kHello, kEot, kHello, kSpaceWor, 'l', 'd', kEot}));
  EXPECT_EQ(t.decode(ids), "hellohello world");
  EXPECT_EQ(t.decode(ids, /*keep_special=*/true), text);
  EXPECT_EQ(t.token_bytes(kEot), "<|endoftext|>");
  // A partial match is plain text.
  EXPECT_EQ(t.decode(t.encode("<|endoftext|")), "<|endoftext|");

  // <s> and </s>: BOS and EOS of their own; a non-special added token decodes as its text.
  json added = json::array();
  added.push_back({{"id", 266}, {"content", "<s>"}, {"special", true}});
  added.push_back({{"id", 267}, {"content", "</s>"}, {"special", true}});
  added.push_back({{"id", 268}, {"content", "<sep>"}, {"special", false}});
  const Tokenizer s = Tokenizer::from_file(
      write("s.json", tokenizer_json({{"type", "ByteLevel"}, {"use_regex", true}}, false, added)));
  EXPECT_EQ(s.size(), 269);
  EXPECT_EQ(s.bos_id(), std::optional<int32_t>(266));
  EXPECT_EQ(s.eos_id(), std::optional<int32_t>(267));
  EXPECT_FALSE(s.is_special(268));
  const Ids sids = s.encode("<s>hello<sep>lo</s>");
  EXPECT_EQ(sids, (Ids{266, kHello, 268, kLo, 267}));
  EXPECT_EQ(s.decode(sids), "hello<sep>lo");

  // No added tokens: no BOS or EOS.
  const Tokenizer none = Tokenizer::from_file(
      write("none.json",
            tokenizer_json({{"type", "ByteLevel"}, {"use_regex", true}}, false, json::array())));
  EXPECT_FALSE(none.bos_id().has_value());
  EXPECT_FALSE(none.eos_id().has_value());
  EXPECT_EQ(none.size(), 266);
}

// Added tokens are found by an automaton over the reversed tokens (linear in the text): still the
// longest one at the leftmost place, overlaps and the 1 MiB windows' edges included.
TEST_F(TokenizerFiles, OverlappingAddedTokensLeftmostLongest) {
  json added = json::array();
  int32_t id = 266;
  for (const char* content : {"ab", "abc", "bcd", "c", "xyzzy"})
    added.push_back({{"id", id++}, {"content", content}, {"special", false}});
  const Tokenizer t = Tokenizer::from_file(
      write("o.json", tokenizer_json({{"type", "ByteLevel"}, {"use_regex", true}}, false, added)));
  EXPECT_EQ(t.encode("abcd"), (Ids{267, 'd'}));         // abc, the longest at 0, not ab or bcd
  EXPECT_EQ(t.encode("xbcdab"), (Ids{'x', 268, 266}));  // bcd at 1, then ab
  EXPECT_EQ(t.encode("abab c"), (Ids{266, 266, ' ', 269}));
  EXPECT_EQ(t.encode("xyzzxyzzy"), (Ids{'x', 'y', 'z', 'z', 270}));
  // A token across the edge of the first window, and one that begins the second.
  const size_t w = size_t(1) << 20;
  for (size_t at : {w - 2, w - 1, w, w + 1}) {
    const std::string text = std::string(at, ' ') + "abcd";
    const Ids ids = t.encode(text);
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ((Ids{ids[ids.size() - 2], ids.back()}), (Ids{267, 'd'})) << at;
    EXPECT_EQ(t.decode(ids), text);
  }
}

// A token longer than kMaxTokenBytes is refused by its index and id; JSON nested deeper than 512
// levels by the file, the limit and where.
TEST_F(TokenizerFiles, LongTokensAndDeepJsonAreRefusedByName) {
  json added = json::array();
  added.push_back({{"id", 266}, {"content", std::string(kMaxTokenBytes + 1, 'a')}});
  const std::string big = write("big.json", tokenizer_json({{"type", "ByteLevel"}}, false, added));
  std::string err = error_of([&] { Tokenizer::from_file(big); });
  EXPECT_MENTIONS(err, big);
  EXPECT_MENTIONS(err, "added_tokens[0] (id 266)");
  EXPECT_MENTIONS(err, "65536");
  std::string deep = tokenizer_json().dump();
  deep.replace(deep.find("\"normalizer\":null"), 17,
               "\"normalizer\":" + std::string(200000, '[') + std::string(200000, ']'));
  const std::string path = write("deep.json", deep);
  err = error_of([&] { Tokenizer::from_file(path); });
  EXPECT_MENTIONS(err, path);
  EXPECT_MENTIONS(err, "deeper than 512 levels");
  EXPECT_MENTIONS(err, "in normalizer[0][0]");
}

TEST_F(TokenizerFiles, DigitsAndPrefixSpacePreTokenizers) {
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const json digits = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Digits"}, {"individual_digits", true}}, byte_level})}};
  const Tokenizer plain = Tokenizer::from_file(write("plain.json", tokenizer_json(byte_level)));
  const Tokenizer d = Tokenizer::from_file(write("digits.json", tokenizer_json(digits)));
  // Each digit alone first, so the merge "1 2" never applies.
  EXPECT_EQ(plain.encode("x12"), (Ids{'x', k12}));
  EXPECT_EQ(d.encode("x12"), (Ids{'x', '1', '2'}));
  EXPECT_EQ(d.encode(" 123 hello"), (Ids{' ', '1', '2', '3', ' ', kHello}));
  EXPECT_EQ(d.encode("12hello"), (Ids{'1', '2', kHello}));
  EXPECT_EQ(d.decode(d.encode("a1b22 c333\n4")), "a1b22 c333\n4");
  EXPECT_NE(d.hash(), plain.hash());

  // add_prefix_space: " " before a text that does not start with one.
  json prefixed = byte_level;
  prefixed["add_prefix_space"] = true;
  const Tokenizer p = Tokenizer::from_file(write("prefix.json", tokenizer_json(prefixed)));
  EXPECT_EQ(p.encode("hello"), (Ids{' ', kHello}));
  EXPECT_EQ(p.encode(" hello"), (Ids{' ', kHello}));
  EXPECT_EQ(p.encode("world"), (Ids{kSpaceWor, 'l', 'd'}));
  // Digits with add_prefix_space is refused, naming the file.
  json both = digits;
  both["pretokenizers"][1] = prefixed;
  const std::string bad = write("both.json", tokenizer_json(both));
  const std::string err = error_of([&] { Tokenizer::from_file(bad); });
  EXPECT_MENTIONS(err, bad);
  EXPECT_MENTIONS(err, "add_prefix_space");
}

TEST_F(TokenizerFiles, HashIsStableForAFileAndDiffersBetweenTokenizers) {
  const std::string a = write("a.json", tokenizer_json());
  json other = tokenizer_json();
  other["model"]["merges"].erase(other["model"]["merges"].end() - 1);  // drops "1 2"
  const std::string b = write("b.json", other);
  const Tokenizer ta = Tokenizer::from_file(a), ta2 = Tokenizer::from_file(a),
                  tb = Tokenizer::from_file(b);
  EXPECT_EQ(ta.hash().size(), 16u);
  EXPECT_EQ(ta.hash().find_first_not_of("0123456789abcdef"), std::string::npos) << ta.hash();
  EXPECT_EQ(ta.hash(), ta2.hash());
  EXPECT_EQ(ta.hash(), Tokenizer::from_json(tokenizer_json().dump(2)).hash());
  EXPECT_NE(ta.hash(), tb.hash());
  EXPECT_NE(ta.hash(), Tokenizer::bytes().hash());
  // The one merge less shows: " 123" keeps 1 and 2 apart.
  EXPECT_EQ(tb.encode(" 123"), (Ids{' ', '1', '2', '3'}));
  // Copies share the vocabulary and answer the same.
  Tokenizer copy = ta;
  EXPECT_EQ(copy.hash(), ta.hash());
  EXPECT_EQ(copy.encode("hello world"), ta.encode("hello world"));
}

TEST_F(TokenizerFiles, BadFilesAreRefusedNamingThePathAndTheValue) {
  const std::string missing = dir_ + "/missing.json";
  std::string err = error_of([&] { Tokenizer::from_file(missing); });
  EXPECT_MENTIONS(err, "cannot read '" + missing + "'");

  const std::string garbage = write("garbage.json", std::string("{ \"model\": "));
  err = error_of([&] { Tokenizer::from_file(garbage); });
  EXPECT_MENTIONS(err, garbage);
  EXPECT_MENTIONS(err, "not valid JSON");

  // Each case: a change to the good file, and what the message names besides the path.
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    std::string names;
  };
  const std::vector<Case> cases = {
      {"no model", [](json& j) { j.erase("model"); }, "no \"model\" object"},
      {"model type", [](json& j) { j["model"]["type"] = "WordPiece"; }, "'WordPiece'"},
      {"normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "NFKC"}};  // NFC reads (Qwen2's); its compatibility form not
       },
       "NFKC"},
      {"pre-tokenizer",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "Whitespace"},
      {"no vocab", [](json& j) { j["model"].erase("vocab"); }, "no model.vocab"},
      {"an id gap", [](json& j) { j["model"]["vocab"].erase("hello"); }, "without gaps"},
      {"a merge with no space", [](json& j) { j["model"]["merges"][0] = "he"; }, "merge 'he'"},
      // A merge must name vocabulary tokens and make one (Hugging Face refuses it on load).
      {"a merge of an unknown token", [](json& j) { j["model"]["merges"].push_back("zz z"); },
       "'zz'"},
      {"a merge into an unknown token", [](json& j) { j["model"]["merges"].push_back("q u"); },
       "'qu'"},
      // The wrong JSON types: an fsdp::Error naming the file, not the JSON library's exception.
      {"a vocab id that is no number", [](json& j) { j["model"]["vocab"]["hello"] = "259"; },
       "259"},
      {"an added token with no id", [](json& j) { j["added_tokens"][0].erase("id"); }, "id"},
      {"a merge that is a number", [](json& j) { j["model"]["merges"][0] = 7; }, "merge"},
  };
  for (const Case& c : cases) {
    json j = tokenizer_json();
    c.edit(j);
    const std::string path = write("bad.json", j);
    err = error_of([&] { Tokenizer::from_file(path); });
    EXPECT_MENTIONS(err, path) << c.what;
    EXPECT_MENTIONS(err, c.names) << c.what;
  }
  // from_json names what it is given as the source.
  err = error_of([] { Tokenizer::from_json("[1, 2]", "checkpoint 7's tokenizer"); });
  EXPECT_MENTIONS(err, "checkpoint 7's tokenizer");
}

// SentencePiece-style BPE (byte_fallback): Gemma's shape, then Llama 2's and Metaspace's prefixes.
// Vocabulary: <unk> <s> </s>, the 256 <0xXX> byte tokens, then characters and merges.
json spm_json(json normalizer, json pre_tokenizer) {
  const std::string M = "\u2581";
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int32_t id = 259;
  for (const std::string& t :
       std::vector<std::string>{M, "h", "i", "a", "b", M + "h", M + "hi", "hi", "ab", M + M})
    vocab[t] = id++;
  // rank order: "h i" before "▁ h", so "▁hi" = ▁ + hi is reached through "hi"
  const json merges =
      json::array({json::array({"h", "i"}), json::array({M, "h"}), json::array({M, "hi"}),
                   json::array({M + "h", "i"}), json::array({"a", "b"}), json::array({M, M})});
  return {{"version", "1.0"},
          {"added_tokens", json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}},
                                        {{"id", 2}, {"content", "</s>"}, {"special", true}}})},
          {"normalizer", normalizer},
          {"pre_tokenizer", pre_tokenizer},
          {"model",
           {{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"vocab", vocab},
            {"merges", merges}}}};
}

TEST_F(TokenizerFiles, SentencePieceBytesFallbackAndPrefixes) {
  const json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  // ids: ▁ 259, h 260, i 261, a 262, b 263, ▁h 264, ▁hi 265, hi 266, ab 267, ▁▁ 268
  const Tokenizer gemma = Tokenizer::from_json(spm_json(replace, nullptr).dump());
  EXPECT_TRUE(gemma.is_sentencepiece());
  EXPECT_FALSE(gemma.prefixes_space());
  EXPECT_EQ(gemma.encode("hi"), (Ids{266}));
  EXPECT_EQ(gemma.encode(" hi"), (Ids{265}));  // h+i first (rank 0), then ▁+hi (rank 2)
  EXPECT_EQ(gemma.encode("  ab"), (Ids{268, 267}));
  // 'é' is no token: its two bytes' tokens, C3 A9; '\n' (0x0A) too
  EXPECT_EQ(gemma.encode("\xC3\xA9\n"), (Ids{3 + 0xC3, 3 + 0xA9, 3 + 0x0A}));
  EXPECT_EQ(gemma.encode("<s>hi</s>"), (Ids{1, 266, 2}));
  EXPECT_EQ(gemma.decode(gemma.encode(" hi \xC3\xA9 ab\n")), " hi \xC3\xA9 ab\n");
  EXPECT_EQ(gemma.token_bytes(265), " hi");
  EXPECT_EQ(gemma.token_bytes(3 + 0xC3), "\xC3");
  EXPECT_EQ(gemma.bos_id(), 1);
  EXPECT_EQ(gemma.eos_id(), 2);
  EXPECT_MENTIONS(gemma.describe(), "SentencePiece BPE");

  // Llama 2: Prepend('▁') on every piece between added tokens; decode drops the first space.
  const json prepend = {
      {"type", "Sequence"},
      {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", "\u2581"}}, replace})}};
  const Tokenizer llama2 = Tokenizer::from_json(spm_json(prepend, nullptr).dump());
  EXPECT_TRUE(llama2.prefixes_space());
  EXPECT_EQ(llama2.encode("hi</s>hi"), (Ids{265, 2, 265}));
  EXPECT_EQ(llama2.decode(llama2.encode("hi ab")), "hi ab");
  // Metaspace "first": only the text's first piece, and not when it begins with a space.
  const json first = {{"type", "Metaspace"},
                      {"replacement", "\u2581"},
                      {"prepend_scheme", "first"},
                      {"split", false}};
  const Tokenizer meta = Tokenizer::from_json(spm_json(nullptr, first).dump());
  EXPECT_EQ(meta.encode("hi</s>hi"), (Ids{265, 2, 266}));
  EXPECT_EQ(meta.encode(" hi"), (Ids{265}));

  // A character with neither a token nor every byte's token is the unk token, runs fused.
  json no_bytes = spm_json(replace, nullptr);
  no_bytes["model"]["vocab"].erase("<0xC3>");
  no_bytes["model"]["vocab"]["<0xC3>x"] = 3 + 0xC3;  // keep the ids without gaps
  const Tokenizer unk = Tokenizer::from_json(no_bytes.dump());
  EXPECT_EQ(unk.encode("\xC3\xA9\xC3\xA9h"), (Ids{0, 260}));

  // Shapes that are not SentencePiece's are refused by name.
  EXPECT_MENTIONS(error_of([&] {
                    Tokenizer::from_json(spm_json({{"type", "NFKC"}}, nullptr).dump());
                  }),
                  "NFKC");
  EXPECT_MENTIONS(error_of([&] { Tokenizer::from_json(spm_json(nullptr, nullptr).dump()); }),
                  "never '\u2581'");
  json split = first;
  split["split"] = true;
  EXPECT_MENTIONS(error_of([&] { Tokenizer::from_json(spm_json(nullptr, split).dump()); }),
                  "split false");
}

}  // namespace
}  // namespace fsdp::data
