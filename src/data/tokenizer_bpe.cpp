// The encoder's engine (Tokenizer::Impl, tokenizer_impl.h): BPE as Hugging Face tokenizers runs
// it: added tokens first (an Aho-Corasick automaton over the reversed tokens, linear in the text
// whatever the tokens' lengths), then
//   - byte-level: GPT-2's split (after each number code point is split off alone, when the
//     tokenizer.json has a Digits(individual_digits) pre-tokenizer before ByteLevel), bytes ->
//     GPT-2's printable code points;
//   - SentencePiece-style: spaces -> U+2581 (and one before the text, where the file says so),
//     the whole text between added tokens one piece, characters -> their tokens or their bytes'
//     <0xXX> tokens;
// then the merges in rank order (the lowest rank first, the leftmost of equal ranks).
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
#include <string_view>
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

void Tokenizer::Impl::build_added_automaton() {
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

std::vector<int32_t> Tokenizer::Impl::added_starts(std::string_view text, size_t from) const {
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

void Tokenizer::Impl::merge(std::vector<int32_t>& sym) const {
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

std::vector<int32_t> Tokenizer::Impl::bpe(std::string_view piece) const {
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

void Tokenizer::Impl::encode_plain(std::string_view text, bool first, std::vector<int32_t>& out) const {
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

}  // namespace fsdp::data
