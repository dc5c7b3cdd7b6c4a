// Chats (fsdp/data/chat.h): conversations rendered by the model's template with their target
// spans, and tokenized once. The JSONL reader of both sample forms and the one-sample-per-row
// source are samples.cpp.
#include "fsdp/data/chat.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "fsdp/core/error.h"
#include "fsdp/data/jinja.h"
#include "fsdp/data/tokenizer.h"
#include "src/data/byte_level.h"

namespace fsdp::data {

namespace {

using nlohmann::ordered_json;

// The end of s[begin, end) less the whitespace at its end, as Python's str.rstrip() strips it
// (Unicode's spaces; an invalid byte is not one).
size_t without_trailing_space(const std::string& s, size_t begin, size_t end) {
  while (end > begin) {
    size_t start = end - 1;  // the last code point's first byte
    while (start > begin && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
    const auto [cp, len] = byte_level::decode_utf8(s, start);
    if (cp == byte_level::kInvalid || start + len != end || !byte_level::python_space(cp)) break;
    end = start;
  }
  return end;
}

// transformers' variables: the messages, the flag, the tokenizer's special tokens, and tools and
// documents as None.
ordered_json chat_context(const Conversation& chat, bool add_generation_prompt,
                          const std::optional<std::string>& bos,
                          const std::optional<std::string>& eos) {
  ordered_json messages = ordered_json::array();
  for (const ChatMessage& m : chat)
    messages.push_back(ordered_json{{"role", m.role}, {"content", m.content}});
  ordered_json ctx{{"messages", std::move(messages)},
                   {"tools", nullptr},
                   {"documents", nullptr},
                   {"add_generation_prompt", add_generation_prompt}};
  if (bos) ctx["bos_token"] = *bos;
  if (eos) ctx["eos_token"] = *eos;
  return ctx;
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

ChatTemplate::ChatTemplate(const std::string& source, std::string name,
                           std::optional<std::string> bos_token,
                           std::optional<std::string> eos_token)
    : template_(std::make_shared<const jinja::Template>(source, std::move(name))),
      bos_(std::move(bos_token)),
      eos_(std::move(eos_token)) {}

ChatTemplate ChatTemplate::of_model(const std::string& source, const Tokenizer& tok,
                                    std::optional<int32_t> bos, std::optional<int32_t> eos,
                                    std::string name) {
  auto spelled = [&](std::optional<int32_t> id) -> std::optional<std::string> {
    if (!id || *id < 0 || *id >= tok.size()) return std::nullopt;
    return tok.token_bytes(*id);
  };
  return ChatTemplate(source, std::move(name), spelled(bos ? bos : tok.bos_id()),
                      spelled(eos ? eos : tok.eos_id()));
}

std::string ChatTemplate::text(const Conversation& chat, bool add_generation_prompt) const {
  return template_->render(chat_context(chat, add_generation_prompt, bos_, eos_)).text;
}

RenderedChat ChatTemplate::render(const Conversation& chat) const {
  jinja::Rendered all = template_->render(chat_context(chat, false, bos_, eos_));
  RenderedChat out{std::move(all.text), {}};
  if (template_->has_generation_blocks()) {
    out.targets = std::move(all.generation_spans);
    return out;
  }
  for (size_t i = 0; i < chat.size(); ++i) {
    if (chat[i].role != "assistant") continue;
    const Conversation before(chat.begin(), chat.begin() + ptrdiff_t(i));
    const Conversation through(chat.begin(), chat.begin() + ptrdiff_t(i) + 1);
    const std::string p = text(before, true), f = text(through, false);
    if (!f.starts_with(p)) {
      const size_t same =
          size_t(std::mismatch(f.begin(), f.end(), p.begin(), p.end()).first - f.begin());
      FSDP_FAIL(
          "[chat] {}: the text of the conversation through message {} (an assistant turn) "
          "does not begin with its text up to that turn with the generation prompt, so the "
          "turn's target span cannot be found; after {} equal bytes, '{}' against '{}'",
          template_->name(), i, same, f.substr(same, 40), p.substr(same, 40));
    }
    const size_t end = without_trailing_space(f, p.size(), f.size());
    FSDP_CHECK(
        out.text.compare(0, end, f, 0, end) == 0,
        "[chat] {}: the template writes message {} (an assistant turn) differently once "
        "the turns after it follow, so no span of the conversation's text is that turn's; "
        "through it: '...{}', in the whole conversation: '...{}' (a template with "
        "{{% generation %}} blocks, --chat-template, marks the targets itself)",
        template_->name(), i, f.substr(p.size(), std::min<size_t>(end - p.size(), 60)),
        out.text.substr(std::min(p.size(), out.text.size()), std::min<size_t>(end - p.size(), 60)));
    if (end > p.size()) out.targets.emplace_back(p.size(), end);
  }
  return out;
}

bool ChatTemplate::has_generation_blocks() const { return template_->has_generation_blocks(); }

const std::string& ChatTemplate::name() const { return template_->name(); }

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
