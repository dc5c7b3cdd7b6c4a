// BPE as Hugging Face tokenizers runs it (fsdp/data/tokenizer.h): added tokens first, then
//   - byte-level: GPT-2's split (after each number code point is split off alone, when the
//     tokenizer.json has a Digits(individual_digits) pre-tokenizer before ByteLevel), bytes ->
//     GPT-2's printable code points;
//   - SentencePiece-style: spaces -> U+2581 (and one before the text, where the file says so),
//     the whole text between added tokens one piece, characters -> their tokens or their bytes'
//     <0xXX> tokens;
// then the merges in rank order (the lowest rank first, the leftmost of equal ranks).
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
#include <unordered_map>
#include <utility>

#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/core/interrupt.h"
#include "src/core/json_read.h"
#include "src/data/byte_level.h"

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

struct Tokenizer::Impl {
  bool bytes = false;
  // SentencePiece-style BPE: a tokenizer.json whose BPE has byte_fallback (Gemma's, Llama 2's).
  // The symbols are characters, a space is U+2581 ("▁"), and a character that is no token is its
  // bytes' <0xXX> tokens. Without it, GPT-2's byte-level BPE.
  bool spm = false;
  // Where "▁" goes before a piece of text between added tokens (spm): Prepend in the normalizer
  // or Metaspace's "always" (every piece), Metaspace's "first" (the text's first piece only).
  enum class Prefix { none, every, first } prefix = Prefix::none;
  bool prefix_unless_space = false;  // Metaspace's: none before a piece that begins with a space
  std::optional<int32_t> unk;        // model.unk_token's id (spm, for a character with no bytes)
  bool fuse_unk = false;
  std::array<int32_t, 256> byte_ids{};  // spm: <0xXX>'s id; byte-level: GPT-2's character's id
  std::string json_text, where;
  std::vector<std::string> tokens;  // as the vocabulary spells them, by id
  std::unordered_map<std::string, int32_t> ids;
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> pair_merge;
  std::vector<std::pair<std::string, std::string>> merge_list;
  std::vector<std::pair<std::string, int32_t>> added;  // content, id
  // The added tokens reversed, as an Aho-Corasick automaton over bytes: scanning a text from its
  // end, the state at position s names the longest added token that starts at s, so finding them
  // all costs time linear in the text whatever the tokens' lengths (a walk of a forward trie from
  // every position was quadratic: a 1 MB added token made 20 kB of text take 7 s).
  // (node << 8 | byte) -> child; per node: its failure link, the token (index into `added`) it
  // spells, and the longest token among it and its failure chain, or -1.
  std::unordered_map<uint64_t, int32_t> rtrie;
  std::vector<int32_t> rfail{0}, rterm{-1}, rbest{-1};
  std::vector<std::vector<std::pair<unsigned char, int32_t>>> rkids{{}};
  std::vector<bool> special;
  bool add_prefix_space = false;
  bool split_digits = false;  // a Digits(individual_digits) pre-tokenizer before ByteLevel
  bool nfc = false;           // an NFC normalizer (Qwen2's, Qwen3's): each piece NFC'd first
  int llama3_digits = 0;      // Llama 3's split regex (3), Qwen2's (1), else GPT-2's (0)
  std::optional<int32_t> bos, eos, text_prefix;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  // The SentencePiece shapes Hugging Face writes: normalizer Replace(' ', '▁') (Gemma's) or
  // Sequence [Prepend('▁'), Replace(' ', '▁')] (Llama 2's), or pre_tokenizer Metaspace without
  // split; a Split on ' ' after the Replace has no space left to split on.
  void read_spm_shape(const nlohmann::json& norm, const nlohmann::json& pre);

  static uint64_t pair_key(int32_t a, int32_t b) {
    return uint64_t(uint32_t(a)) << 32 | uint64_t(uint32_t(b));
  }

  int32_t rchild(int32_t node, unsigned char c) const {
    const auto it = rtrie.find(uint64_t(node) << 8 | c);
    return it == rtrie.end() ? -1 : it->second;
  }

  // Builds the automaton from `added` (the first of two equal contents wins, as the first of
  // equal keys does in a trie; an empty content matches nothing).
  void build_added_automaton() {
    for (size_t k = 0; k < added.size(); ++k) {
      const std::string& content = added[k].first;
      max_added = std::max(max_added, content.size());
      int32_t node = 0;
      for (size_t i = content.size(); i-- > 0;) {
        const unsigned char c = static_cast<unsigned char>(content[i]);
        int32_t next = rchild(node, c);
        if (next < 0) {
          next = int32_t(rterm.size());
          rtrie.emplace(uint64_t(node) << 8 | c, next);
          rkids[size_t(node)].emplace_back(c, next);
          rkids.emplace_back();
          rfail.push_back(0);
          rterm.push_back(-1);
          rbest.push_back(-1);
        }
        node = next;
      }
      if (node > 0 && rterm[size_t(node)] < 0) rterm[size_t(node)] = int32_t(k);
    }
    std::queue<int32_t> bfs;  // failure links, shallow nodes first
    for (const auto& [c, child] : rkids[0]) {
      rbest[size_t(child)] = rterm[size_t(child)];
      bfs.push(child);
    }
    while (!bfs.empty()) {
      const int32_t u = bfs.front();
      bfs.pop();
      for (const auto& [c, v] : rkids[size_t(u)]) {
        int32_t f = rfail[size_t(u)], g = rchild(f, c);
        while (g < 0 && f != 0) {
          f = rfail[size_t(f)];
          g = rchild(f, c);
        }
        rfail[size_t(v)] = g >= 0 && g != v ? g : 0;
        rbest[size_t(v)] =
            rterm[size_t(v)] >= 0 ? rterm[size_t(v)] : rbest[size_t(rfail[size_t(v)])];
        bfs.push(v);
      }
    }
  }

  // For each position of text[from, from + n) (n at most kAddedChunk), the longest added token
  // that starts there (index into `added`), or -1; empty when there are no added tokens. The scan
  // begins max_added bytes past the window, so the states inside it are those of a whole scan.
  static constexpr size_t kAddedChunk = size_t(1) << 20;
  size_t max_added = 0;
  std::vector<int32_t> added_starts(std::string_view text, size_t from) const {
    if (rterm.size() < 2) return {};
    const size_t end = std::min(text.size(), from + kAddedChunk);
    std::vector<int32_t> best(end - from, -1);
    int32_t node = 0;
    for (size_t s = std::min(text.size(), end + max_added); s-- > from;) {
      const unsigned char c = static_cast<unsigned char>(text[s]);
      int32_t g = rchild(node, c);
      while (g < 0 && node != 0) {
        node = rfail[size_t(node)];
        g = rchild(node, c);
      }
      node = g >= 0 ? g : 0;
      if (s < end) best[s - from] = rbest[size_t(node)];
    }
    return best;
  }

  // Hugging Face's BPE merge loop: the adjacent pair of the lowest merge rank is merged (the
  // leftmost of equal ranks) until no pair has a merge. A heap of candidate pairs over a linked
  // list of symbols, so a long piece (SentencePiece's whole text between added tokens) costs
  // n log n, not n^2.
  void merge(std::vector<int32_t>& sym) const {
    const int32_t n = int32_t(sym.size());
    if (n < 2 || pair_merge.empty()) return;
    struct Cand {
      int32_t rank, left, right, merged;
      bool operator<(const Cand& o) const {  // the heap's top: lowest rank, then leftmost
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    std::vector<int32_t> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) prev[size_t(i)] = i - 1, next[size_t(i)] = i + 1;
    std::priority_queue<Cand> heap;
    auto push = [&](int32_t l, int32_t r) {
      auto it = pair_merge.find(pair_key(sym[size_t(l)], sym[size_t(r)]));
      if (it != pair_merge.end()) heap.push({it->second.first, l, r, it->second.second});
    };
    for (int32_t i = 0; i + 1 < n; ++i) push(i, i + 1);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      const size_t l = size_t(c.left), r = size_t(c.right);
      if (sym[l] < 0 || sym[r] < 0 || next[l] != c.right) continue;  // gone or no longer adjacent
      auto it = pair_merge.find(pair_key(sym[l], sym[r]));
      if (it == pair_merge.end() || it->second.second != c.merged) continue;  // changed since
      sym[l] = c.merged;
      sym[r] = -1;
      next[l] = next[r];
      if (next[l] < n) prev[size_t(next[l])] = c.left;
      if (prev[l] >= 0) push(prev[l], c.left);
      if (next[l] < n) push(c.left, next[l]);
    }
    sym.erase(std::remove(sym.begin(), sym.end(), -1), sym.end());
  }

  // One piece of text (raw bytes for byte-level BPE; normalized text for spm) -> ids.
  std::vector<int32_t> bpe(std::string_view piece) const {
    std::vector<int32_t> sym;
    if (bytes) {
      for (char c : piece) sym.push_back(int32_t(static_cast<unsigned char>(c)));
      return sym;
    }
    const bool cacheable = piece.size() <= 256;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mu);
      auto it = cache.find(std::string(piece));
      if (it != cache.end()) return it->second;
    }
    sym.reserve(piece.size());
    if (!spm) {
      for (char c : piece) {
        const int32_t id = byte_ids[static_cast<unsigned char>(c)];
        FSDP_CHECK(id >= 0,
                   "[tokenizer] {}: the byte 0x{:02X} has no token (the vocabulary lacks a "
                   "character of GPT-2's alphabet?)",
                   where, static_cast<unsigned char>(c));
        sym.push_back(id);
      }
    } else {
      bool last_unk = false;
      for (size_t i = 0; i < piece.size();) {
        const size_t len = std::max<size_t>(1, decode_utf8(piece, i).second);
        const std::string_view ch = piece.substr(i, len);
        i += len;
        if (auto it = ids.find(std::string(ch)); it != ids.end()) {
          sym.push_back(it->second);
          last_unk = false;
          continue;
        }
        // byte_fallback: every byte's <0xXX> token, or none of them and the unk token
        const bool all_bytes = std::all_of(ch.begin(), ch.end(), [&](char c) {
          return byte_ids[static_cast<unsigned char>(c)] >= 0;
        });
        if (all_bytes) {
          for (char c : ch) sym.push_back(byte_ids[static_cast<unsigned char>(c)]);
          last_unk = false;
          continue;
        }
        FSDP_CHECK(unk,
                   "[tokenizer] {}: '{}' is no token, lacks a <0xXX> byte token, and the model "
                   "has no unk_token",
                   where, ch);
        if (!(fuse_unk && last_unk)) sym.push_back(*unk);
        last_unk = true;
      }
    }
    merge(sym);
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mu);
      if (cache.size() < (1u << 16)) cache.emplace(std::string(piece), sym);
    }
    return sym;
  }

  // The text between two added tokens; `first` when it begins the whole text.
  void encode_plain(std::string_view text, bool first, std::vector<int32_t>& out) const {
    if (spm) {
      if (text.empty()) return;
      std::string s;
      if ((prefix == Prefix::every || (prefix == Prefix::first && first)) &&
          !(prefix_unless_space && text[0] == ' '))
        s = "\u2581";
      for (char c : text) {
        if (c == ' ')
          s += "\u2581";
        else
          s += c;
      }
      auto r = bpe(s);
      out.insert(out.end(), r.begin(), r.end());
      return;
    }
    std::string normalized;
    if (nfc) {
      normalized = byte_level::nfc(text);
      text = normalized;
    }
    std::string prefixed;
    if (add_prefix_space && !text.empty() && text[0] != ' ') {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    size_t pieces = 0;
    auto split = [&](std::string_view part) {
      for (std::string_view piece :
           llama3_digits > 0 ? llama3_split(part, llama3_digits) : gpt2_split(part)) {
        if ((++pieces & 4095) == 0) throw_if_interrupted("tokenizing a text");  // a long text
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
