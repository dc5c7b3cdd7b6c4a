// Unicode's canonical composition (NFC), as Hugging Face tokenizers' NFC normalizer applies it
// (Qwen2's and Qwen3's tokenizer.json): canonical decomposition (Hangul syllables by their
// arithmetic), canonical ordering of the combining marks, then canonical composition (UAX #15).
// The tables are src/data/unicode_nfc.inc, generated from Python's unicodedata.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/data/byte_level.h"

namespace fsdp::data::byte_level {

namespace {

struct CombiningRange {
  char32_t lo, hi;
  uint8_t cls;
};
struct Triple {
  char32_t a, b, c;
};
#include "src/data/unicode_nfc.inc"

// Hangul's syllables, composed of a leading consonant, a vowel and an optional trailing one.
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

int combining_class(char32_t c) {
  if (c < 0x300) return 0;
  const auto* end = std::end(kCombining);
  const auto* it = std::upper_bound(std::begin(kCombining), end, c,
                                    [](char32_t v, const CombiningRange& r) { return v < r.lo; });
  if (it == std::begin(kCombining)) return 0;
  --it;
  return c <= it->hi ? it->cls : 0;
}

void decompose(char32_t c, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* end = std::end(kDecompositions);
  const auto* it = std::lower_bound(std::begin(kDecompositions), end, c,
                                    [](const Triple& t, char32_t v) { return t.a < v; });
  if (it == end || it->a != c) {
    out.push_back(c);
    return;
  }
  decompose(it->b, out);
  if (it->c) decompose(it->c, out);
}

// The primary composite of a and b, or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto* end = std::end(kCompositions);
  const auto* it = std::lower_bound(
      std::begin(kCompositions), end, Triple{a, b, 0},
      [](const Triple& x, const Triple& y) { return x.a != y.a ? x.a < y.a : x.b < y.b; });
  return it != end && it->a == a && it->b == b ? it->c : 0;
}

// NFC of a run of code points, appended to out as UTF-8.
void nfc_run(const std::vector<char32_t>& cps, std::string& out) {
  std::vector<char32_t> d;
  for (char32_t c : cps) decompose(c, d);
  // Canonical ordering: each run of marks stably by class.
  for (size_t i = 1; i < d.size(); ++i) {
    const int cls = combining_class(d[i]);
    if (cls == 0) continue;
    for (size_t j = i; j > 0 && combining_class(d[j - 1]) > cls; --j) std::swap(d[j - 1], d[j]);
  }
  // Canonical composition: each mark composes with the last starter unless blocked.
  std::vector<char32_t> r;
  size_t starter = 0;
  int last = 256;  // the class of the last code point kept after the starter; 256: no starter
  for (char32_t c : d) {
    const int cls = combining_class(c);
    if (!r.empty() && last != 256 && (last < cls || (last == 0 && r.size() - 1 == starter))) {
      if (const char32_t composite = compose(r[starter], c)) {
        r[starter] = composite;
        continue;
      }
    }
    if (cls == 0) {
      starter = r.size();
      last = 0;
    } else if (last != 256) {
      last = cls;
    }
    r.push_back(c);
  }
  for (char32_t c : r) append_utf8(out, c);
}

}  // namespace

std::string nfc(std::string_view s) {
  // Below U+0300 every code point is a starter that NFC keeps: such a prefix stays as it is, but
  // for its last code point, which may compose with what follows.
  size_t i = 0, last = 0;
  while (i < s.size()) {
    const auto [cp, len] = decode_utf8(s, i);
    if (cp != kInvalid && cp >= 0x300) break;
    last = i;
    i += len;
  }
  if (i >= s.size()) return std::string(s);
  std::string out(s.substr(0, last));
  i = last;
  std::vector<char32_t> run;
  while (i < s.size()) {
    const auto [cp, len] = decode_utf8(s, i);
    if (cp == kInvalid) {  // a byte that is no UTF-8: the run ends, the byte stays as it is
      nfc_run(run, out);
      run.clear();
      out += s[i];
    } else {
      run.push_back(cp);
    }
    i += len;
  }
  nfc_run(run, out);
  return out;
}

}  // namespace fsdp::data::byte_level
