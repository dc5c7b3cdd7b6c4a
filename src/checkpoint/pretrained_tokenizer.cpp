// load_pretrained's tokenizer half: a Hugging Face folder's tokenizer.json, tokenizer_config.json
// (special tokens, chat template), chat_template.jinja and generation_config.json, the end-of-turn
// id, and a chat template given by file; GGUF files carry theirs in their own keys (pretrained.cpp).
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/models/spec.h"
#include "src/core/json_fields.h"
#include "src/core/json_read.h"
#include "src/checkpoint/gguf_format_names.h"
#include "src/checkpoint/pretrained_impl.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pretrained_detail {

std::string read_text(const fs::path& p) {
  check_regular(p.string(), "[pretrained]");
  // Sized before it is read: a config or template of gigabytes is refused, not loaded whole.
  std::error_code ec;
  const uintmax_t size = fs::file_size(p, ec);
  FSDP_CHECK(!ec && size <= json_read::kSmallMaxBytes,
             "[pretrained] '{}' holds {} bytes: a model folder's config, template or tokenizer "
             "settings must be at most {} MiB",
             p.string(), ec ? std::string("an unknown number of") : std::to_string(size),
             json_read::kSmallMaxBytes >> 20);
  std::ifstream f(p, std::ios::binary);
  FSDP_CHECK(f.good(), "[pretrained] cannot read '{}'", p.string());
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// The id of token `text`, if the vocabulary has it.
std::optional<int32_t> token_id(const data::Tokenizer& tok, const std::string& text) {
  const auto& tokens = tok.tokens();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == text) return int32_t(i);
  return std::nullopt;
}

// End of turn: ChatML's <|im_end|> when the template uses it, else EOS.
void set_eot(Pretrained& p) {
  p.eot_id = p.tokenizer ? end_of_turn_id(*p.tokenizer, p.chat_template, p.eos_id) : p.eos_id;
}

namespace {

// tokenizer_config.json's bos_token / eos_token: a string or {"content": ...}.
std::optional<std::string> token_field(const json& j, const char* key, const std::string& where) {
  const json* v = json_fields::member(j, key);
  if (!v) return std::nullopt;
  const json_fields::Field f{"[pretrained]", where, key};
  if (v->is_string()) return v->get<std::string>();
  if (!v->is_object()) f.wrong("a string or an object with a \"content\" string", *v);
  const json* content = json_fields::member(*v, "content");
  if (!content) f.wrong("a string or an object with a \"content\" string", *v);
  return f.at("content").string(*content);
}

}  // namespace

// The tokenizer files of a Hugging Face folder: tokenizer.json, tokenizer_config.json's chat
// template and special tokens, generation_config.json's ids.
void read_hf_tokenizer(Pretrained& p, const fs::path& dir) {
  if (!fs::exists(dir / "tokenizer.json")) return;
  p.tokenizer = data::Tokenizer::from_file((dir / "tokenizer.json").string());
  p.bos_id = p.tokenizer->bos_id();
  p.eos_id = p.tokenizer->eos_id();
  // Hugging Face's Sequence [Digits(individual_digits), ByteLevel] and its Split regexes by
  // llama.cpp's pre-tokenizer names (gguf_format_names.h).
  try {
    const json tj = json::parse(p.tokenizer->json());
    p.tokenizer_pre = gguf_format::kGpt2Split;
    const json& pre = tj.value("pre_tokenizer", json());
    if (pre.is_object() && pre.value("type", "") == "Sequence")
      for (const json& s : pre.value("pretokenizers", json::array())) {
        if (s.value("type", "") == "Digits") p.tokenizer_pre = gguf_format::kDigitsPre;
        const std::string regex = s.contains("pattern") && s["pattern"].is_object()
                                      ? s["pattern"].value("Regex", "")
                                      : "";
        if (const std::string_view name = gguf_format::split_pre_name(regex); !name.empty())
          p.tokenizer_pre = name;
      }
  } catch (const json::exception&) {
  }
  if (fs::exists(dir / "tokenizer_config.json")) {
    const std::string where = (dir / "tokenizer_config.json").string();
    const json tc = json_read::parse(read_text(dir / "tokenizer_config.json"), where,
                                     "[pretrained]", json_read::kSmallMaxBytes);
    FSDP_CHECK(tc.is_object(), "[pretrained] {}: expected a JSON object, got {}", where,
               json_fields::described(tc));
    if (const json* t = json_fields::member(tc, "chat_template")) {
      const json_fields::Field f{"[pretrained]", where, "chat_template"};
      p.chat_template_source = where + "'s chat_template";
      if (t->is_string()) {
        p.chat_template = t->get<std::string>();
      } else if (t->is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (size_t i = 0; i < t->size(); ++i) {
          const json& e = f.at(i).object((*t)[i]);
          const json* name = json_fields::member(e, "name");
          const json* text = json_fields::member(e, "template");
          if (name && f.at(i).at("name").string(*name) == "default" && text)
            p.chat_template = f.at(i).at("template").string(*text);
        }
      } else {
        f.wrong("a string or an array of {\"name\", \"template\"}", *t);
      }
    }
    if (auto b = token_field(tc, "bos_token", where)) p.bos_id = token_id(*p.tokenizer, *b);
    if (auto e = token_field(tc, "eos_token", where)) p.eos_id = token_id(*p.tokenizer, *e);
  }
  // transformers 5 saves the template beside tokenizer_config.json, as chat_template.jinja (and
  // reads it before tokenizer_config.json's).
  if (fs::exists(dir / "chat_template.jinja")) {
    p.chat_template = read_text(dir / "chat_template.jinja");
    p.chat_template_source = (dir / "chat_template.jinja").string();
  }
  if (fs::exists(dir / "generation_config.json")) {
    const std::string where = (dir / "generation_config.json").string();
    const json g = json_read::parse(read_text(dir / "generation_config.json"), where,
                                    "[pretrained]", json_read::kSmallMaxBytes);
    FSDP_CHECK(g.is_object(), "[pretrained] {}: expected a JSON object, got {}", where,
               json_fields::described(g));
    if (const json* b = json_fields::member(g, "bos_token_id"))
      p.bos_id = json_fields::Field{"[pretrained]", where, "bos_token_id"}.id(*b);
    if (const json* e = json_fields::member(g, "eos_token_id")) {
      const json_fields::Field f{"[pretrained]", where, "eos_token_id"};
      if (e->is_array()) {  // the first is the one that ends a turn
        for (size_t i = 0; i < e->size(); ++i) f.at(i).id((*e)[i]);
        if (!e->empty()) p.eos_id = f.at(0).id((*e)[0]);
      } else {
        p.eos_id = f.id(*e);
      }
    }
  }
  set_eot(p);
}

}  // namespace pretrained_detail

using namespace pretrained_detail;

std::optional<int32_t> end_of_turn_id(const data::Tokenizer& tok, const std::string& raw_template,
                                      std::optional<int32_t> eos) {
  const std::string chat_template = data::without_jinja_comments(raw_template);
  for (const char* end : {"<|im_end|>", "<end_of_turn>", "<|eot_id|>"})
    if (chat_template.find(end) != std::string::npos)
      if (auto id = token_id(tok, end)) return id;
  return eos;
}

void set_chat_template(Pretrained& p, const std::string& jinja_file) {
  check_regular(jinja_file, "[pretrained] chat template");
  p.chat_template = read_text(jinja_file);
  p.chat_template_source = jinja_file;
  FSDP_CHECK(!p.chat_template.empty(), "[pretrained] chat template {} is empty", jinja_file);
  set_eot(p);
}

std::string chat_template_name(const Pretrained& p) {
  return p.chat_template_source.empty() ? "chat_template" : p.chat_template_source;
}

std::string render_chat(const Pretrained& p, const data::Tokenizer& tok, const std::string& user,
                        const std::optional<std::string>& system) {
  data::Conversation chat;
  if (system) chat.push_back({"system", *system});
  chat.push_back({"user", user});
  return data::ChatTemplate::of_model(p.chat_template, tok, p.bos_id, p.eos_id,
                                     chat_template_name(p))
      .text(chat, true);
}

}  // namespace fsdp::checkpoint
