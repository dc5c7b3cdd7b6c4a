// Tokenizer's state (private to src/data): the vocabulary, the merges, the added tokens' automaton
// and the pieces' cache, read by tokenizer_json.cpp (from a tokenizer.json, or the bytes) and used
// by the encoder, tokenizer_bpe.cpp (added tokens, then each piece's BPE merges). Keeping it in
// one struct keeps Tokenizer a cheap handle (a shared_ptr to a const Impl).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fsdp/data/tokenizer.h"

namespace fsdp::data {

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
  void build_added_automaton();

  // For each position of text[from, from + n) (n at most kAddedChunk), the longest added token
  // that starts there (index into `added`), or -1; empty when there are no added tokens. The scan
  // begins max_added bytes past the window, so the states inside it are those of a whole scan.
  static constexpr size_t kAddedChunk = size_t(1) << 20;
  size_t max_added = 0;
  std::vector<int32_t> added_starts(std::string_view text, size_t from) const;

  // Hugging Face's BPE merge loop: the adjacent pair of the lowest merge rank is merged (the
  // leftmost of equal ranks) until no pair has a merge. A heap of candidate pairs over a linked
  // list of symbols, so a long piece (SentencePiece's whole text between added tokens) costs
  // n log n, not n^2.
  void merge(std::vector<int32_t>& sym) const;

  // One piece of text (raw bytes for byte-level BPE; normalized text for spm) -> ids.
  std::vector<int32_t> bpe(std::string_view piece) const;

  // The text between two added tokens; `first` when it begins the whole text.
  void encode_plain(std::string_view text, bool first, std::vector<int32_t>& out) const;
};

}  // namespace fsdp::data
