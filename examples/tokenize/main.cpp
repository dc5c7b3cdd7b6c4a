// fsdp-tokenize: text <-> ids with the library's tokenizer, to check it against
// another (tests/tokenizer_test.sh holds it to Hugging Face tokenizers).
//   fsdp-tokenize --tokenizer data/tokenizer.json < text.txt      ids, one line
//   fsdp-tokenize --tokenizer bytes --decode < ids.txt            the text
//   fsdp-tokenize --tokenizer model.gguf < text.txt               a GGUF's own tokenizer
//   fsdp-tokenize --tokenizer model.gguf --save-json tokenizer.json   ... as a tokenizer.json
//   fsdp-tokenize --tokenizer T a.txt b.txt      one line of ids per file
//   fsdp-tokenize --tokenizer T --decode a.ids   writes a.ids.txt
//   fsdp-tokenize --tokenizer MODEL --chat chats.jsonl
//       each {"messages": [...]} line rendered with MODEL's chat template (a GGUF file or a
//       Hugging Face folder: its tokenizer and template) by the Jinja engine and tokenized as
//       fsdp-train trains on it: one line {"ids": [...], "target": [0|1, ...]} per conversation
//       (tests/chat_test.py); a conversation the template refuses stops it, naming the line
//   fsdp-tokenize --tokenizer tokenizer.json --chat-template T.jinja --chat chats.jsonl
//       the same with a tokenizer file alone and a template
//   fsdp-tokenize --chat-template T.jinja --render --chat chats.jsonl
//       each line's conversation rendered by the Jinja engine (fsdp/data/jinja.h) as
//       transformers' apply_chat_template renders it: one line {"text": "...", "generation":
//       [[begin, end], ...]} (the byte spans of the template's {% generation %} blocks) per
//       conversation, or {"error": "..."} for one the template refuses (exit status 1 at the end).
//       A line is the template's variables: "messages", and "tools", "add_generation_prompt",
//       "bos_token", any other keyword (tools and documents are null when absent)
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/core/error.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/jinja.h"
#include "fsdp/data/tokenizer.h"

namespace {

// --chat: each conversation as fsdp-train sees it, ids and targets.
void print_chats(const std::string& model, const std::string& jsonl,
                 const std::string& chat_template) {
  fsdp::checkpoint::Pretrained pre;
  if (model.ends_with(".json")) {  // a tokenizer alone: the template from --chat-template
    FSDP_CHECK(!chat_template.empty(),
               "[fsdp-tokenize] --chat with the tokenizer file {} needs --chat-template FILE (a "
               "tokenizer.json holds no template)",
               model);
    pre.tokenizer = fsdp::data::Tokenizer::from_file(model);
  } else {
    pre = fsdp::checkpoint::load_pretrained(model);
  }
  if (!chat_template.empty()) fsdp::checkpoint::set_chat_template(pre, chat_template);
  FSDP_CHECK(pre.tokenizer, "[fsdp-tokenize] --chat: {} has no tokenizer", model);
  FSDP_CHECK(!pre.chat_template.empty(), "[fsdp-tokenize] --chat: {} has no chat template", model);
  const auto tmpl = fsdp::data::ChatTemplate::of_model(pre.chat_template, *pre.tokenizer,
                                                       pre.bos_id, pre.eos_id,
                                                       fsdp::checkpoint::chat_template_name(pre));
  std::vector<int64_t> lines;
  const auto chats = fsdp::data::read_chat_jsonl(jsonl, &lines);
  for (size_t k = 0; k < chats.size(); ++k) {
    const auto s = fsdp::data::chat_sample(jsonl, lines[k], *pre.tokenizer, tmpl, chats[k]);
    std::string ids, target;
    for (size_t i = 0; i < s.ids.size(); ++i) {
      ids += (i ? "," : "") + std::to_string(s.ids[i]);
      target += (i ? "," : "") + std::to_string(int(s.target[i]));
    }
    fmt::print("{{\"ids\": [{}], \"target\": [{}]}}\n", ids, target);
  }
}

// --render: the Jinja engine's text for each JSONL line; every line is tried, refusals reported.
int render_chats(const std::string& jsonl, const std::string& template_path) {
  std::ifstream tf(template_path, std::ios::binary);
  FSDP_CHECK(tf.good(), "[fsdp-tokenize] --render: cannot read the template '{}'", template_path);
  const std::string source((std::istreambuf_iterator<char>(tf)), {});
  std::optional<fsdp::data::jinja::Template> tmpl;
  std::string refusal;
  try {
    tmpl.emplace(source, template_path);
  } catch (const fsdp::Error& e) {
    refusal = std::string(fsdp::without_source_place(e.what()));
  }
  std::ifstream in(jsonl, std::ios::binary);
  FSDP_CHECK(in.good(), "[fsdp-tokenize] --render: cannot read '{}'", jsonl);
  std::string line;
  int refused = 0;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::ordered_json out;
    try {
      if (!tmpl) FSDP_FAIL("{}", refusal);
      auto ctx = nlohmann::ordered_json::parse(line);
      FSDP_CHECK(ctx.is_object() && ctx.contains("messages"),
                 "[fsdp-tokenize] {}:{}: expected an object with \"messages\"", jsonl, n);
      for (const char* key : {"tools", "documents"})
        if (!ctx.contains(key)) ctx[key] = nullptr;
      if (!ctx.contains("add_generation_prompt")) ctx["add_generation_prompt"] = false;
      const auto r = tmpl->render(ctx);
      out["text"] = r.text;
      out["generation"] = r.generation_spans;
    } catch (const std::exception& e) {
      out = nlohmann::ordered_json{{"error", fmt::format("{}:{}: {}", jsonl, n,
                                                         fsdp::without_source_place(e.what()))}};
      ++refused;
    }
    fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  }
  if (refused) fmt::print(stderr, "fsdp-tokenize: {} conversation(s) refused\n", refused);
  return refused ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = "bytes", chat, chat_template, save_json;
  bool decode = false, render = false;
  std::vector<std::string> files;
  CLI::App app{"fsdp-tokenize: encode stdin to ids, or decode ids to text", "fsdp-tokenize"};
  app.add_option("--tokenizer", path,
                 "a tokenizer.json (byte-level or SentencePiece BPE), a GGUF file's tokenizer, or "
                 "bytes")
      ->capture_default_str();
  app.add_flag("--decode", decode, "read ids (whitespace-separated), write the text");
  app.add_option(
      "--chat", chat,
      "a JSONL file of conversations: print each one's ids and targets, rendered with "
      "the chat template of --tokenizer (a model: GGUF file or Hugging Face folder; or a "
      "tokenizer.json with --chat-template)");
  app.add_option("--chat-template", chat_template,
                 "with --chat: a Jinja chat template file in place of the model's own");
  app.add_flag("--render", render,
               "with --chat and --chat-template: print each conversation's rendered text and its "
               "{% generation %} spans as JSON lines (no tokenizer needed)");
  app.add_option("--save-json", save_json,
                 "write the tokenizer as Hugging Face's tokenizer.json (a GGUF's, as transformers "
                 "reads it) to this file");
  app.add_option("files", files, "inputs (default: stdin); --decode writes FILE.txt for each");
  CLI11_PARSE(app, argc, argv);
  try {
    if (render) {
      FSDP_CHECK(!chat.empty() && !chat_template.empty(),
                 "[fsdp-tokenize] --render needs --chat FILE.jsonl and --chat-template FILE");
      return render_chats(chat, chat_template);
    }
    if (!chat.empty()) {
      print_chats(path, chat, chat_template);
      return 0;
    }
    const auto tok = path == "bytes" ? fsdp::data::Tokenizer::bytes()
                     : path.ends_with(".gguf")
                         ? fsdp::checkpoint::gguf_tokenizer(fsdp::checkpoint::GgufFile(path))
                         : fsdp::data::Tokenizer::from_file(path);
    if (!save_json.empty()) {
      std::ofstream out(save_json, std::ios::binary);
      out << tok.json();
      FSDP_CHECK(out.good(), "[fsdp-tokenize] cannot write '{}'", save_json);
    }
    auto run = [&](const std::string& in, const std::string& name) {
      if (decode) {
        std::vector<int32_t> ids;
        std::istringstream ss(in);
        std::string word;
        while (ss >> word) {
          try {
            ids.push_back(int32_t(std::stol(word)));
          } catch (const std::exception&) {
            FSDP_FAIL("[fsdp-tokenize] {}: '{}' is not an id", name, word);
          }
        }
        const std::string text = tok.decode(ids, true);
        if (name == "-") {
          std::fwrite(text.data(), 1, text.size(), stdout);
        } else {
          std::ofstream out(name + ".txt", std::ios::binary);
          out << text;
          FSDP_CHECK(out.good(), "[fsdp-tokenize] cannot write '{}.txt'", name);
        }
      } else {
        const auto ids = tok.encode(in);
        std::string line;
        for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
        fmt::print("{}\n", line);
      }
    };
    if (files.empty() && save_json.empty())
      run(std::string((std::istreambuf_iterator<char>(std::cin)), {}), "-");
    for (const std::string& f : files) {
      std::ifstream in(f, std::ios::binary);
      FSDP_CHECK(in.good(), "[fsdp-tokenize] cannot read '{}'", f);
      run(std::string((std::istreambuf_iterator<char>(in)), {}), f);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fsdp-tokenize: error: {}\n", e.what());
    return 1;
  }
}
