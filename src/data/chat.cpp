// Chats (fsdp/data/chat.h): the template recognized, conversations rendered with their target
// spans, and tokenized once. The JSONL reader of both sample forms and the one-sample-per-row
// source are samples.cpp.
#include "fsdp/data/chat.h"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <type_traits>

#include "fsdp/core/error.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/data/tokenizer.h"
#include "src/core/json_read.h"
#include "src/data/byte_level.h"
#include "src/data/data_files.h"

namespace fsdp::data {

namespace {

using nlohmann::json;

constexpr std::string_view kStart = "<|im_start|>", kEnd = "<|im_end|>";
constexpr std::string_view kGemmaStart = "<start_of_turn>", kGemmaEnd = "<end_of_turn>";
constexpr std::string_view kHeaderStart = "<|start_header_id|>", kHeaderEnd = "<|end_header_id|>",
                           kEot = "<|eot_id|>", kLlamaBos = "<|begin_of_text|>";

bool has(const std::string& s, std::string_view what) { return s.find(what) != std::string::npos; }


// The text of a Jinja string literal from `at` to its first escape or closing quote: the
// "December 2023" of "Cutting Knowledge Date: December 2023\n".
std::string literal_until_escape(const std::string& t, size_t at) {
  const size_t end = t.find_first_of("\\'\"", at);
  return end == std::string::npos ? "" : t.substr(at, end - at);
}

// Today's date as the templates' strftime_now("%d %b %Y") writes it in transformers: Python's
// datetime.now(), local time, the C locale's month ("04 Dec 2026").
std::string today_d_b_Y() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof buf, "%d %b %Y", &local);
  return std::string(buf, n);
}

// Llama 3.1's to 3.3's system block before the system message: the knowledge cutoff and the date
// the template writes, or none where it writes no such block (Llama 3.0's).
std::optional<std::string> llama3_system_preamble(const std::string& t) {
  constexpr std::string_view cutoff = "Cutting Knowledge Date: ", today = "Today Date: ";
  const size_t c = t.find(cutoff);
  if (c == std::string::npos) return std::nullopt;
  const std::string when = literal_until_escape(t, c + cutoff.size());
  // The date: today's where the template asks strftime_now for it (transformers defines it),
  // else the literal it sets date_string to when the caller passes none.
  std::string date;
  if (has(t, "strftime_now")) {
    date = today_d_b_Y();
  } else {
    constexpr std::string_view set = "date_string = ";
    const size_t d = t.find(set);
    if (d != std::string::npos && d + set.size() < t.size() &&
        (t[d + set.size()] == '"' || t[d + set.size()] == '\''))
      date = literal_until_escape(t, d + set.size() + 1);
  }
  FSDP_CHECK(!when.empty() && !date.empty() && has(t, today) && has(t, "date_string") &&
                 has(t, "system_message"),
             "[chat] the model's Llama 3 chat template writes a '{}' system block but not as "
             "Llama 3.1's to 3.3's do (the cutoff, 'Today Date: ' and a date_string that is a "
             "literal or strftime_now's, then the system message); refusing to guess. Write "
             "the samples as tokenized rows with scripts/chat_rows.py",
             cutoff);
  return fmt::format("{}{}\n{}{}\n\n", cutoff, when, today, date);
}

}  // namespace

std::string without_jinja_comments(const std::string& t) {
  std::string out;
  size_t at = 0;
  for (size_t open = t.find("{#"); open != std::string::npos; open = t.find("{#", at)) {
    out += t.substr(at, open - at);
    const size_t close = t.find("#}", open + 2);
    if (close == std::string::npos) return out;
    at = close + 2;
  }
  return out + t.substr(at);
}

ChatFormat ChatFormat::recognize(const std::string& raw) {
  const std::string t = without_jinja_comments(raw);
  // Llama 3's headers: <|begin_of_text|>, then each turn
  // <|start_header_id|>{role}<|end_header_id|>\n\n{content | trim}<|eot_id|>, and the generation
  // prompt <|start_header_id|>assistant<|end_header_id|>\n\n. 3.1's to 3.3's templates open with a
  // system block whatever the conversation holds (llama3_system_preamble); the tools they can
  // describe are not rendered here (a conversation holds system, user and assistant turns only).
  if (has(t, kHeaderStart) && has(t, kHeaderEnd) && has(t, kEot)) {
    FSDP_CHECK(has(t, "add_generation_prompt") && has(t, "trim") && has(t, "bos_token") &&
                   has(t, "['content']") && (has(t, "['role']") || has(t, ".role")) &&
                   has(t, "<|start_header_id|>assistant<|end_header_id|>"),
               "[chat] the model's chat template writes <|start_header_id|> and <|eot_id|> but not "
               "as Llama 3's templates do (the BOS token, a header per turn, trimmed content, the "
               "generation prompt); refusing to guess. Write the samples as tokenized rows with "
               "scripts/chat_rows.py. Its start: '{}'",
               t.substr(0, 120));
    ChatFormat f;
    f.kind_ = Kind::llama3;
    f.system_preamble_ = llama3_system_preamble(t);
    return f;
  }
  // Gemma's turns: <start_of_turn>{user|model}\n{content | trim}<end_of_turn>\n after the BOS
  // token, the system message folded into the first user turn, the generation prompt
  // <start_of_turn>model\n. Taken as Gemma's when the template writes those markers, maps the
  // assistant to "model", trims the content and writes the generation prompt.
  if (has(t, kGemmaStart) && has(t, kGemmaEnd)) {
    const bool gemma = has(t, "<start_of_turn>model") || has(t, "\"model\"");
    FSDP_CHECK(gemma && has(t, "add_generation_prompt") && has(t, "trim") && has(t, "bos_token") &&
                   has(t, "['content']"),
               "[chat] the model's chat template writes <start_of_turn> and <end_of_turn> but not "
               "as Gemma 3's instruct template does (the BOS token, turns of user and model, "
               "trimmed content, the generation prompt); refusing to guess. Write the samples "
               "as tokenized rows with scripts/chat_rows.py. Its start: '{}'",
               t.substr(0, 120));
    ChatFormat f;
    f.kind_ = Kind::gemma;
    return f;
  }
  // ChatML: each turn is <|im_start|>{role}\n{content}<|im_end|>\n, and the generation prompt
  // <|im_start|>assistant\n. A template is taken as ChatML when it writes those markers, the
  // role and the content, and the generation prompt.
  const bool chatml = has(t, kStart) && has(t, kEnd) && has(t, "add_generation_prompt") &&
                      has(t, "<|im_start|>assistant") && has(t, "['role']") &&
                      has(t, "['content']");
  FSDP_CHECK(chatml,
             "[chat] the model's chat template is not ChatML (<|im_start|>role ... <|im_end|>), "
             "Gemma's (<start_of_turn>role ... <end_of_turn>) nor Llama 3's "
             "(<|start_header_id|>role<|end_header_id|> ... <|eot_id|>), the forms rendered here; "
             "refusing to guess. Write the samples as tokenized rows "
             "({{\"input_ids\": [...], \"labels\": [...]}}) with the model's own renderer "
             "(scripts/chat_rows.py). Its start: '{}'",
             t.substr(0, 120));
  ChatFormat f;
  f.kind_ = Kind::chatml;
  // The template's default system message: a literal "<|im_start|>system\n...<|im_end|>" with no
  // expression inside (SmolLM2's "You are a helpful AI assistant named SmolLM, ...").
  const std::string open = std::string(kStart) + "system\n";
  for (size_t at = t.find(open); at != std::string::npos && !f.default_system_;
       at = t.find(open, at + 1)) {
    const size_t b = at + open.size(), e = t.find(kEnd, b);
    if (e == std::string::npos) break;
    const std::string text = t.substr(b, e - b);
    if (text.find_first_of("'\"{}") == std::string::npos) f.default_system_ = text;
  }
  return f;
}

std::string ChatFormat::name() const {
  return kind_ == Kind::gemma ? "Gemma" : kind_ == Kind::llama3 ? "Llama 3" : "ChatML";
}

const std::string& ChatFormat::end_of_turn() const {
  static const std::string chatml(kEnd), gemma(kGemmaEnd), llama3(kEot);
  return kind_ == Kind::gemma ? gemma : kind_ == Kind::llama3 ? llama3 : chatml;
}

namespace {

// Jinja's trim: Python's str.strip(), Unicode's spaces at both ends.
std::string python_strip(const std::string& s) {
  auto space_at = [&](size_t i) {
    const auto [cp, len] = byte_level::decode_utf8(s, i);
    return std::pair(cp != byte_level::kInvalid && byte_level::python_space(cp), len);
  };
  size_t b = 0;
  while (b < s.size()) {
    const auto [space, len] = space_at(b);
    if (!space) break;
    b += len;
  }
  size_t e = b;  // the end of the last code point that is not a space
  for (size_t i = b; i < s.size();) {
    const auto [space, len] = space_at(i);
    i += len;
    if (!space) e = i;
  }
  return s.substr(b, e - b);
}

RenderedChat render_gemma(const Conversation& chat, bool add_generation_prompt) {
  RenderedChat out;
  out.text = "<bos>";  // {{ bos_token }}: Gemma's
  size_t first = 0;
  std::string prefix;  // the system message, before the first user turn's content
  if (!chat.empty() && chat[0].role == "system") {
    prefix = chat[0].content + "\n\n";
    first = 1;
  }
  for (size_t i = first; i < chat.size(); ++i) {
    const ChatMessage& m = chat[i];
    FSDP_CHECK(
        (m.role == "user") == ((i - first) % 2 == 0) && (m.role == "user" || m.role == "assistant"),
        "[chat] message {}: role '{}'; Gemma's template needs the roles to alternate "
        "user/assistant/user/... after an optional system turn",
        i, m.role);
    out.text += std::string(kGemmaStart) + (m.role == "assistant" ? "model" : "user") + "\n";
    if (i == first) out.text += prefix;
    const size_t begin = out.text.size();
    out.text += python_strip(m.content);
    out.text += kGemmaEnd;
    if (m.role == "assistant") out.targets.emplace_back(begin, out.text.size());
    out.text += "\n";
  }
  if (add_generation_prompt) out.text += std::string(kGemmaStart) + "model\n";
  return out;
}

// Llama 3's: the BOS, each turn's header and trimmed content and <|eot_id|>. 3.1's to 3.3's
// templates take a first system turn into their system block, after its preamble (and write the
// block, with an empty message, where there is none); 3.0's writes a system turn as any other.
RenderedChat render_llama3(const ChatFormat& format, const Conversation& chat,
                           bool add_generation_prompt) {
  RenderedChat out;
  out.text = kLlamaBos;
  auto header = [&](const std::string& role) {
    out.text += std::string(kHeaderStart) + role + std::string(kHeaderEnd) + "\n\n";
  };
  size_t first = 0;
  if (const auto& preamble = format.system_preamble()) {
    header("system");
    out.text += *preamble;
    if (!chat.empty() && chat[0].role == "system") {
      out.text += python_strip(chat[0].content);
      first = 1;
    }
    out.text += kEot;
  }
  for (size_t i = first; i < chat.size(); ++i) {
    header(chat[i].role);
    const size_t begin = out.text.size();
    out.text += python_strip(chat[i].content);
    out.text += kEot;
    if (chat[i].role == "assistant") out.targets.emplace_back(begin, out.text.size());
  }
  if (add_generation_prompt) header("assistant");
  return out;
}

}  // namespace

RenderedChat render(const ChatFormat& format, const Conversation& chat,
                    bool add_generation_prompt) {
  for (size_t i = 0; i < chat.size(); ++i) {
    const ChatMessage& m = chat[i];
    FSDP_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant",
               "[chat] message {}: role '{}'; expected system, user or assistant", i, m.role);
    FSDP_CHECK(m.role != "system" || i == 0,
               "[chat] message {}: a system turn after the first message; the system turn, "
               "when there is one, comes first",
               i);
  }
  if (format.kind() == ChatFormat::Kind::gemma) return render_gemma(chat, add_generation_prompt);
  if (format.kind() == ChatFormat::Kind::llama3)
    return render_llama3(format, chat, add_generation_prompt);
  RenderedChat out;
  auto turn = [&](const std::string& role, const std::string& content) {
    out.text += std::string(kStart) + role + "\n";
    const size_t begin = out.text.size();
    out.text += content;
    out.text += kEnd;
    if (role == "assistant") out.targets.emplace_back(begin, out.text.size());
    out.text += "\n";
  };
  for (size_t i = 0; i < chat.size(); ++i) {
    const ChatMessage& m = chat[i];
    if (i == 0 && m.role != "system" && format.default_system())
      turn("system", *format.default_system());
    turn(m.role, m.content);
  }
  if (add_generation_prompt) out.text += std::string(kStart) + "assistant\n";
  return out;
}

TokenizedSample tokenize_chat(const Tokenizer& tok, const RenderedChat& chat) {
  TokenizedSample s;
  s.ids = tok.encode(chat.text);
  s.target.assign(s.ids.size(), 0);
  size_t at = 0, span = 0;  // the token's first byte; the first span that may still overlap
  for (size_t i = 0; i < s.ids.size(); ++i) {
    const size_t end = at + tok.token_bytes(s.ids[i]).size();
    while (span < chat.targets.size() && chat.targets[span].second <= at) ++span;
    s.target[i] = span < chat.targets.size() && chat.targets[span].first < end &&
                  chat.targets[span].second > at;
    at = end;
  }
  // The tokens' bytes are the text's (a byte-level vocabulary): a tokenizer that normalized the
  // text would leave the spans pointing at the wrong tokens.
  FSDP_CHECK(at == chat.text.size(),
             "[chat] {}: the tokens' bytes ({}) are not the text's ({}); its spans cannot be "
             "mapped to tokens",
             tok.describe(), at, chat.text.size());
  return s;
}

}  // namespace fsdp::data
