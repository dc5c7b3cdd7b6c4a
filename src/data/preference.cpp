// Preference pairs (fsdp/data/preference.h): TRL's two forms read and checked line by line,
// tokenized as TRL 1.16's DPOTrainer tokenizes them, and batched two rows a pair.
#include "fsdp/data/preference.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/core/tensor.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/tokenizer.h"
#include "src/core/json_read.h"
#include "src/data/jsonl_lines.h"

namespace fsdp::data {

namespace {

using nlohmann::json;

// TRL's common_prefix_length.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// How a line's text becomes tokens: the standard form's strings, or the conversational form's
// messages through the chat template.
struct PairTokenizer {
  const std::string& path;
  const Tokenizer& tok;
  const std::string& chat_template;
  std::optional<int32_t> bos, eos;
  const std::string& template_name;
  std::optional<ChatTemplate> chat;  // parsed at the first conversational line

  // tokenizer(text): the text's framing (Llama's BOS) and its tokens.
  std::vector<int32_t> encode_text(const std::string& text) const {
    std::vector<int32_t> ids = tok.encode(text);
    if (const auto p = tok.text_prefix_id(); p && (ids.empty() || ids[0] != *p))
      ids.insert(ids.begin(), *p);
    return ids;
  }

  std::string render(int64_t line, const Conversation& c, bool generation_prompt) {
    if (!chat) chat = ChatTemplate::of_model(chat_template, tok, bos, eos, template_name);
    try {
      return chat->text(c, generation_prompt);
    } catch (const Error& e) {
      FSDP_FAIL("[data] {}:{}: the chat template refuses the pair: {}", path, line,
                without_source_place(e.what()));
    }
  }

  // The prompt's tokens and each prompt-and-reply's, before the common prefix is taken.
  std::vector<std::vector<int32_t>> standard(int64_t line, const json& j) {
    std::string prompt = j["prompt"].get<std::string>();
    std::vector<std::vector<int32_t>> out{encode_text(prompt)};
    const std::optional<int32_t> e = eos ? eos : tok.eos_id();
    const std::string eos_text = e ? tok.decode({*e}, /*keep_special=*/true) : "";
    for (const char* field : {"chosen", "rejected"}) {
      std::string reply = j[field].get<std::string>();
      FSDP_CHECK(!reply.empty(), "[data] {}:{}: \"{}\" is an empty string; expected the reply",
                 path, line, field);
      if (!eos_text.empty() && !reply.ends_with(eos_text)) reply += eos_text;  // TRL's add_eos
      out.push_back(encode_text(prompt + reply));
    }
    return out;
  }

  std::vector<std::vector<int32_t>> conversational(int64_t line, const json& j) {
    FSDP_CHECK(tok.is_bytes() == false && !chat_template.empty(),
               "[data] {}:{}: a conversational pair needs the model's tokenizer and chat template "
               "(a pretrained model that has both: --init-from); {}",
               path, line, tok.is_bytes() ? "the run's tokenizer is bytes"
                                          : "the model has no chat template");
    const Conversation prompt = messages_of(path, line, j["prompt"], "prompt");
    std::vector<std::vector<int32_t>> out{tok.encode(render(line, prompt, true))};
    for (const char* field : {"chosen", "rejected"}) {
      const Conversation reply = messages_of(path, line, j[field], field);
      for (size_t i = 0; i < reply.size(); ++i)
        FSDP_CHECK(!reply[i].content.empty(),
                   "[data] {}:{}: {}[{}].content is an empty string; expected the reply", path,
                   line, field, i);
      Conversation all = prompt;
      all.insert(all.end(), reply.begin(), reply.end());
      out.push_back(tok.encode(render(line, all, false)));
    }
    return out;
  }
};

}  // namespace

PreferenceSource::PreferenceSource(std::vector<PreferencePair> pairs, std::string description,
                                   int32_t pad, int64_t seq, bool keep_end)
    : pairs_(std::move(pairs)),
      description_(std::move(description)),
      pad_(pad),
      seq_(seq),
      keep_end_(keep_end) {
  FSDP_CHECK(!pairs_.empty(), "[data] {} has no pairs", description_);
  FSDP_CHECK(seq_ > 0, "[data] {}: seq must be positive, got {}", description_, seq_);
}

void PreferenceSource::fill_row(int64_t k, int which, int64_t seq, int32_t* in,
                                int32_t* tg) const {
  const PreferencePair& p = pairs_[size_t(k)];
  const std::vector<int32_t>& reply = which == 0 ? p.chosen : p.rejected;
  const int64_t np = int64_t(p.prompt.size());
  // The row's seq + 1 tokens from `start`: the sequence's first (keep_start) or its last.
  const int64_t total = np + int64_t(reply.size()), len = std::min<int64_t>(total, seq + 1);
  const int64_t start = keep_end_ ? total - len : 0;
  const auto id = [&](int64_t t) {
    t += start;
    return t < np ? p.prompt[size_t(t)] : reply[size_t(t - np)];
  };
  for (int64_t t = 0; t < seq; ++t) {
    in[t] = t < len ? id(t) : pad_;
    tg[t] = t + 1 < len && start + t + 1 >= np ? id(t + 1) : int32_t(kIgnoreIndex);
  }
}

Batch PreferenceSource::windows(int64_t first, int64_t rows, int64_t seq) const {
  FSDP_CHECK(first >= 0 && rows >= 0 && seq > 0 && first % 2 == 0 && rows % 2 == 0,
             "[data] windows({}, {}, seq {}) of {}: preference rows come in pairs (chosen, "
             "rejected), so the first row and the count must be even",
             first, rows, seq, description_);
  Batch b{Tensor::empty({rows, seq}, DType::i32), Tensor::empty({rows, seq}, DType::i32), Tensor()};
  const int64_t n = pairs();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t q = (first + r) / 2;
    const int64_t k = shuffle_ ? shuffle_window(q % n, n, seed_, q / n) : q % n;
    fill_row(k, int(r % 2), seq, b.inputs.data<int32_t>() + r * seq,
             b.targets.data<int32_t>() + r * seq);
    if (!reference_.empty()) b.reference_logps.push_back(reference_[size_t(2 * k + r % 2)]);
  }
  return b;
}

Batch PreferenceSource::pair_rows(int64_t first, int64_t count, int64_t seq) const {
  FSDP_CHECK(first >= 0 && count >= 0 && seq > 0,
             "[data] pair_rows({}, {}, seq {}) of {}: expected first >= 0, count >= 0, seq > 0",
             first, count, seq, description_);
  Batch b{Tensor::empty({2 * count, seq}, DType::i32), Tensor::empty({2 * count, seq}, DType::i32),
          Tensor()};
  for (int64_t r = 0; r < 2 * count; ++r)
    fill_row((first + r / 2) % pairs(), int(r % 2), seq, b.inputs.data<int32_t>() + r * seq,
             b.targets.data<int32_t>() + r * seq);
  return b;
}

void PreferenceSource::set_reference(std::vector<double> logps) {
  FSDP_CHECK(int64_t(logps.size()) == 2 * pairs(),
             "[data] {}: {} reference log-probs for {} pairs; expected 2 a pair", description_,
             logps.size(), pairs());
  reference_ = std::move(logps);
}

uint64_t PreferenceSource::content_hash() const {
  uint64_t h = 14695981039346656037ull;
  const auto mix = [&h](int64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ uint64_t((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  mix(seq_), mix(keep_end_ ? 1 : 0), mix(pairs());
  for (const PreferencePair& p : pairs_)
    for (const std::vector<int32_t>* v : {&p.prompt, &p.chosen, &p.rejected}) {
      mix(int64_t(v->size()));
      for (const int32_t id : *v) mix(id);
    }
  return h;
}

int64_t PreferenceSource::truncated(int64_t seq) const {
  int64_t n = 0;
  for (const PreferencePair& p : pairs_)
    n += int64_t(p.prompt.size() + std::max(p.chosen.size(), p.rejected.size())) > seq + 1;
  return n;
}

std::string PreferenceSource::describe() const {
  int64_t tokens = 0;
  for (const PreferencePair& p : pairs_)
    tokens += int64_t(2 * p.prompt.size() + p.chosen.size() + p.rejected.size());
  return fmt::format("{} ({} pairs, {} tokens; {} truncated at --seq {} + 1{}, chosen and "
                     "rejected rows)",
                     description_, pairs(), tokens, truncated(seq_), seq_,
                     keep_end_ ? " keeping their ends" : "");
}

std::pair<std::unique_ptr<PreferenceSource>, std::unique_ptr<PreferenceSource>>
PreferenceSource::split_tail(double fraction) const {
  FSDP_CHECK(fraction > 0 && fraction < 1, "[data] validation fraction must be in (0, 1), got {}",
             fraction);
  const int64_t n = pairs();
  FSDP_CHECK(n >= 2, "[data] {}: {} pair; a validation split needs at least 2", description_, n);
  const int64_t val = std::clamp<int64_t>(int64_t(double(n) * fraction + 0.5), 1, n - 1);
  const auto cut = pairs_.begin() + std::ptrdiff_t(n - val);
  return {std::make_unique<PreferenceSource>(
              std::vector<PreferencePair>(pairs_.begin(), cut),
              fmt::format("{} [first {}]", description_, n - val), pad_, seq_, keep_end_),
          std::make_unique<PreferenceSource>(std::vector<PreferencePair>(cut, pairs_.end()),
                                             fmt::format("{} [last {}]", description_, val), pad_,
                                             seq_, keep_end_)};
}

void PreferenceSource::set_shuffle(uint64_t seed) {
  shuffle_ = true;
  seed_ = seed;
}

bool names_preference_pairs(const std::string& path) {
  if (!path.ends_with(".jsonl")) return false;
  std::ifstream f(path, std::ios::binary);
  // The first non-blank line, read a block at a time and no further than a line may be (the
  // reader's own limit refuses a longer one later, by its line number).
  std::string line;
  constexpr size_t kMaxLine = size_t(64) << 20;
  for (char c; f.get(c);) {
    if (c == '\n') {
      if (line.find_first_not_of(" \t\r") != std::string::npos) break;
      line.clear();
    } else if (line.size() < kMaxLine) {
      line.push_back(c);
    } else {
      return false;
    }
  }
  try {  // an object with a "chosen" or a "rejected" key; anything else is not a pair
    const json j = json_read::parse(line, path + ":1", "[data]");
    return j.is_object() && (j.contains("chosen") || j.contains("rejected"));
  } catch (const Error&) {
    return false;
  }
}

std::unique_ptr<PreferenceSource> open_preference_pairs(
    const std::string& path, const Tokenizer& tok, const std::string& chat_template, int64_t vocab,
    int64_t seq, std::optional<int32_t> bos, std::optional<int32_t> eos,
    const std::string& template_name, bool keep_end) {
  PairTokenizer pt{path, tok, chat_template, bos, eos, template_name, std::nullopt};
  std::vector<PreferencePair> pairs;
  int64_t conversational = 0;
  for_each_line(path, [&](int64_t line, const std::string& text) {
    const json j = json_read::parse(text, fmt::format("{}:{}", path, line), "[data]",
                                    json_read::kSmallMaxBytes);
    FSDP_CHECK(j.is_object(), "[data] {}:{}: {}; expected an object with \"prompt\", \"chosen\" "
               "and \"rejected\"", path, line, kind_of(j));
    for (const char* field : {"prompt", "chosen", "rejected"})
      FSDP_CHECK(j.contains(field),
                 "[data] {}:{}: no \"{}\"; expected a preference pair {{\"prompt\": ..., "
                 "\"chosen\": ..., \"rejected\": ...}} (strings, or lists of messages)",
                 path, line, field);
    const bool chat = j["prompt"].is_array();
    for (const char* field : {"prompt", "chosen", "rejected"})
      FSDP_CHECK(chat ? j[field].is_array() : j[field].is_string(),
                 "[data] {}:{}: \"{}\" is {}; expected {} (\"prompt\" is {})", path, line, field,
                 kind_of(j[field]), chat ? "a list of messages" : "a string",
                 kind_of(j["prompt"]));
    const std::vector<std::vector<int32_t>> ids =
        chat ? pt.conversational(line, j) : pt.standard(line, j);
    conversational += chat;
    const size_t prompt = std::min(common_prefix(ids[0], ids[1]), common_prefix(ids[0], ids[2]));
    PreferencePair p{{ids[0].begin(), ids[0].begin() + std::ptrdiff_t(prompt)},
                     {ids[1].begin() + std::ptrdiff_t(prompt), ids[1].end()},
                     {ids[2].begin() + std::ptrdiff_t(prompt), ids[2].end()}};
    for (const auto& [field, reply] : {std::pair{"chosen", &p.chosen}, {"rejected", &p.rejected}})
      FSDP_CHECK(!reply->empty(), "[data] {}:{}: \"{}\" adds no token to the prompt; expected a "
                 "reply", path, line, field);
    FSDP_CHECK(keep_end || int64_t(p.prompt.size()) <= seq,
               "[data] {}:{}: \"prompt\" is {} tokens, longer than --seq {}: no reply token would "
               "fit in the row (TRL drops such a pair); raise --seq, shorten the prompt or keep "
               "the sequences' ends (--pref-truncation keep_end)",
               path, line, p.prompt.size(), seq);
    for (const auto& [field, part] :
         {std::pair{"prompt", &p.prompt}, {"chosen", &p.chosen}, {"rejected", &p.rejected}})
      for (int32_t id : *part)
        FSDP_CHECK(id >= 0 && id < vocab, "[data] {}:{}: \"{}\" has token id {}, outside the "
                   "model's vocab {}", path, line, field, id, vocab);
    pairs.push_back(std::move(p));
  });
  const int64_t n = int64_t(pairs.size());
  const std::string what =
      conversational == n ? fmt::format("{}: conversational pairs (the model's chat template)", path)
      : conversational == 0 ? fmt::format("{}: standard pairs", path)
                            : fmt::format("{}: {} conversational and {} standard pairs", path,
                                          conversational, n - conversational);
  const int32_t pad = tok.eos_id() ? *tok.eos_id() : 0;
  return std::make_unique<PreferenceSource>(std::move(pairs), what, pad, seq, keep_end);
}

}  // namespace fsdp::data
