// Samples (fsdp/data/chat.h): the JSONL reader of both sample forms (chats, rendered and tokenized
// through chat.cpp, and tokenized rows with their labels), each line checked and refused by file,
// line and field, and SampleSource, one sample per row of a batch.
#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/tokenizer.h"
#include "src/core/json_read.h"
#include "src/data/data_files.h"
#include "src/data/jsonl_lines.h"

namespace fsdp::data {

using nlohmann::json;

SampleSource::SampleSource(std::vector<TokenizedSample> samples, std::string description,
                           int32_t pad, int64_t seq)
    : SampleSource(std::make_shared<const std::vector<TokenizedSample>>(std::move(samples)), 0, -1,
                   std::move(description), pad, seq) {}

SampleSource::SampleSource(std::shared_ptr<const std::vector<TokenizedSample>> all, int64_t begin,
                           int64_t end, std::string description, int32_t pad, int64_t seq)
    : samples_(std::move(all)),
      begin_(begin),
      end_(end < 0 ? int64_t(samples_->size()) : end),
      description_(std::move(description)),
      pad_(pad),
      seq_(seq) {
  FSDP_CHECK(end_ > begin_, "[data] {} has no samples", description_);
  FSDP_CHECK(seq_ > 0, "[data] {}: seq must be positive, got {}", description_, seq_);
}

Batch SampleSource::windows(int64_t first, int64_t rows, int64_t seq) const {
  FSDP_CHECK(first >= 0 && rows >= 0 && seq > 0, "[data] windows({}, {}, seq {}) of {}", first,
             rows, seq, description_);
  Tensor inputs = Tensor::empty({rows, seq}, DType::i32);
  Tensor targets = Tensor::empty({rows, seq}, DType::i32);
  const int64_t n = end_ - begin_;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t q = first + r;
    const int64_t k = shuffle_ ? shuffle_window(q % n, n, seed_, q / n) : q % n;
    const TokenizedSample& s = (*samples_)[size_t(begin_ + k)];
    const int64_t len = std::min<int64_t>(int64_t(s.ids.size()), seq + 1);  // cut at seq + 1
    int32_t* in = inputs.data<int32_t>() + r * seq;
    int32_t* tg = targets.data<int32_t>() + r * seq;
    for (int64_t t = 0; t < seq; ++t) {
      in[t] = t < len ? s.ids[size_t(t)] : pad_;
      tg[t] = t + 1 < len && s.target[size_t(t + 1)] ? s.ids[size_t(t + 1)]
                                                      : int32_t(kIgnoreIndex);
    }
  }
  return {std::move(inputs), std::move(targets), Tensor()};
}

int64_t SampleSource::targets() const {
  int64_t n = 0;
  for (int64_t k = begin_; k < end_; ++k)
    for (uint8_t t : (*samples_)[size_t(k)].target) n += t;
  return n;
}

int64_t SampleSource::longer_than(int64_t seq) const {
  int64_t n = 0;
  for (int64_t k = begin_; k < end_; ++k) n += int64_t((*samples_)[size_t(k)].ids.size()) > seq + 1;
  return n;
}

std::string SampleSource::describe() const {
  int64_t tokens = 0;
  for (int64_t k = begin_; k < end_; ++k) tokens += int64_t((*samples_)[size_t(k)].ids.size());
  return fmt::format("{} ({} samples, {} tokens, {} targets; {} cut at --seq {} + 1, one per row)",
                     description_, end_ - begin_, tokens, targets(), longer_than(seq_), seq_);
}

void SampleSource::set_shuffle(uint64_t seed) {
  shuffle_ = true;
  seed_ = seed;
}

std::pair<std::unique_ptr<SampleSource>, std::unique_ptr<SampleSource>> SampleSource::split_tail(
    double fraction) const {
  FSDP_CHECK(fraction > 0 && fraction < 1, "[data] validation fraction must be in (0, 1), got {}",
             fraction);
  const int64_t n = end_ - begin_;
  FSDP_CHECK(n >= 2, "[data] {}: {} sample; a validation split needs at least 2", description_, n);
  const int64_t val = std::clamp<int64_t>(int64_t(double(n) * fraction + 0.5), 1, n - 1);
  const int64_t cut = end_ - val;
  auto t = std::unique_ptr<SampleSource>(new SampleSource(
      samples_, begin_, cut, fmt::format("{} [first {}]", description_, n - val), pad_, seq_));
  auto v = std::unique_ptr<SampleSource>(new SampleSource(
      samples_, cut, end_, fmt::format("{} [last {}]", description_, val), pad_, seq_));
  return {std::move(t), std::move(v)};
}

bool is_jsonl(const std::string& path) { return names_jsonl_samples(path); }  // by content

namespace {

// One JSONL line's object, or a named error.
json parse_line(const std::string& path, int64_t line_no, const std::string& line) {
  const json j = json_read::parse(line, fmt::format("{}:{}", path, line_no), "[data]",
                                  json_read::kSmallMaxBytes);
  FSDP_CHECK(j.is_object(), "[data] {}:{}: {}; expected an object with \"messages\" or "
             "\"input_ids\"", path, line_no, kind_of(j));
  return j;
}

}  // namespace

std::string kind_of(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::discarded: return "nothing";
    default: return "a number";
  }
}

Conversation messages_of(const std::string& path, int64_t line_no, const json& ms,
                         const std::string& field) {
  FSDP_CHECK(ms.is_array() && !ms.empty(),
             "[data] {}:{}: \"{}\" is {}; expected a non-empty array of "
             "{{\"role\": ..., \"content\": ...}}",
             path, line_no, field, ms.is_array() ? "an empty array" : kind_of(ms));
  Conversation c;
  for (size_t i = 0; i < ms.size(); ++i) {
    const json& m = ms[i];
    FSDP_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(),
               "[data] {}:{}: {}[{}] has no string \"role\"", path, line_no, field, i);
    FSDP_CHECK(m.contains("content") && m["content"].is_string(),
               "[data] {}:{}: {}[{}].content is {}; expected a string", path, line_no, field, i,
               m.contains("content") ? kind_of(m["content"]) : "missing");
    c.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    const std::string& role = c.back().role;
    FSDP_CHECK(role == "system" || role == "user" || role == "assistant",
               "[data] {}:{}: {}[{}].role is '{}'; expected system, user or assistant", path,
               line_no, field, i, role);
    FSDP_CHECK(role != "system" || i == 0,
               "[data] {}:{}: {}[{}] is a system turn after the first message; the system "
               "turn, when there is one, comes first",
               path, line_no, field, i);
  }
  return c;
}

namespace {

// A tokenized row: input_ids, and labels (-100 or the id) when given.
TokenizedSample row_of(const std::string& path, int64_t line_no, const json& j, int64_t vocab) {
  const json& ids = j["input_ids"];
  FSDP_CHECK(ids.is_array() && !ids.empty(),
             "[data] {}:{}: \"input_ids\" is {}; expected a non-empty array of ids", path,
             line_no, kind_of(ids));
  TokenizedSample s;
  for (size_t i = 0; i < ids.size(); ++i) {
    FSDP_CHECK(
        ids[i].is_number_integer() && ids[i].get<int64_t>() >= 0 && ids[i].get<int64_t>() < vocab,
        "[data] {}:{}: input_ids[{}] is {}; expected an id in [0, {}) (the model's vocab)", path,
        line_no, i, json_read::brief(ids[i]), vocab);
    s.ids.push_back(int32_t(ids[i].get<int64_t>()));
  }
  s.target.assign(s.ids.size(), 1);
  if (j.contains("labels")) {
    const json& labels = j["labels"];
    FSDP_CHECK(labels.is_array() && labels.size() == ids.size(),
               "[data] {}:{}: \"labels\" is {}; expected an array of {} labels, one per input id",
               path, line_no, labels.is_array() ? fmt::format("{} long", labels.size())
                                                : kind_of(labels),
               ids.size());
    for (size_t i = 0; i < labels.size(); ++i) {
      const bool ignored = labels[i].is_number_integer() && labels[i].get<int64_t>() == kIgnoreIndex;
      FSDP_CHECK(ignored || labels[i] == ids[i],
                 "[data] {}:{}: labels[{}] is {}; expected -100 (not a target) or input_ids[{}] "
                 "({}): the loss shifts the labels itself, as transformers' does",
                 path, line_no, i, json_read::brief(labels[i]), i, s.ids[i]);
      s.target[i] = !ignored;
    }
  }
  return s;
}

}  // namespace

std::vector<Conversation> read_chat_jsonl(const std::string& path, std::vector<int64_t>* lines) {
  std::vector<Conversation> out;
  for_each_line(path, [&](int64_t line_no, const std::string& line) {
    const json j = parse_line(path, line_no, line);
    FSDP_CHECK(j.contains("messages"), "[data] {}:{}: no \"messages\"; expected {{\"messages\": "
               "[{{\"role\": ..., \"content\": ...}}, ...]}}", path, line_no);
    out.push_back(messages_of(path, line_no, j["messages"], "messages"));
    if (lines) lines->push_back(line_no);
  });
  return out;
}

TokenizedSample chat_sample(const std::string& path, int64_t line, const Tokenizer& tok,
                            const ChatTemplate& chat, const Conversation& conversation) {
  RenderedChat rendered;
  try {
    rendered = chat.render(conversation);
  } catch (const Error& e) {
    FSDP_FAIL("[data] {}:{}: the chat template refuses the conversation: {}", path, line,
              without_source_place(e.what()));
  }
  return tokenize_chat(tok, rendered);
}

std::unique_ptr<SampleSource> open_jsonl_samples(const std::string& path, const Tokenizer* tok,
                                                 const std::string& chat_template, int64_t vocab,
                                                 int64_t seq, std::optional<int32_t> bos,
                                                 std::optional<int32_t> eos,
                                                 const std::string& template_name) {
  std::optional<ChatTemplate> chat;  // parsed at the first chat line
  std::vector<TokenizedSample> samples;
  int64_t chats = 0, rows = 0;
  for_each_line(path, [&](int64_t line_no, const std::string& line) {
    const json j = parse_line(path, line_no, line);
    if (j.contains("messages")) {
      FSDP_CHECK(tok && !tok->is_bytes() && !chat_template.empty(),
                 "[data] {}:{}: a chat sample needs the model's tokenizer and chat template (a "
                 "pretrained model that has both: --init-from); {}",
                 path, line_no, !tok || tok->is_bytes() ? "the run's tokenizer is bytes"
                                                        : "the model has no chat template");
      if (!chat) chat = ChatTemplate::of_model(chat_template, *tok, bos, eos, template_name);
      TokenizedSample s =
          chat_sample(path, line_no, *tok, *chat, messages_of(path, line_no, j["messages"], "messages"));
      for (size_t i = 0; i < s.ids.size(); ++i)
        FSDP_CHECK(s.ids[i] < vocab, "[data] {}:{}: token {} is id {}, outside the model's vocab "
                   "{}", path, line_no, i, s.ids[i], vocab);
      samples.push_back(std::move(s));
      ++chats;
    } else {
      FSDP_CHECK(j.contains("input_ids"),
                 "[data] {}:{}: neither \"messages\" nor \"input_ids\"; expected a chat "
                 "({{\"messages\": [...]}}) or a tokenized row ({{\"input_ids\": [...], "
                 "\"labels\": [...]}})",
                 path, line_no);
      samples.push_back(row_of(path, line_no, j, vocab));
      ++rows;
    }
  });
  std::string what = path + ": ";
  if (chats) what += fmt::format("{} chats (the model's chat template)", chats);
  if (chats && rows) what += ", ";
  if (rows) what += fmt::format("{} tokenized rows", rows);
  const int32_t pad = tok && tok->eos_id() ? *tok->eos_id() : 0;
  return std::make_unique<SampleSource>(std::move(samples), what, pad, seq);
}

}  // namespace fsdp::data
