// Trainer::Impl's data: the tokenizer (the model's, a file's, or bytes) and the training and
// validation sources --data names: preference pairs (--preference), JSONL samples (chats or
// tokenized rows, packed or one per row), a text or shard stream (packed by document or in
// windows), or random tokens.
#include <fmt/core.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/preference.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/data/tokenizer.h"
#include "src/train/trainer_impl.h"

namespace fsdp::train {

namespace {

// A plain text file (not llm.c shards): encoded with a real tokenizer, not read as bytes.
bool is_text_file(const std::string& spec) {
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(spec) || spec.ends_with(".bin")) return false;
  std::ifstream f(spec, std::ios::binary);
  int32_t magic = 0;
  f.read(reinterpret_cast<char*>(&magic), 4);
  return !(f.gcount() == 4 && (magic == 20240520 || magic == 20240801));
}

}  // namespace

void Trainer::Impl::open_data() {
  FSDP_CHECK(!parts.data || o.data.data.empty(),
             "[fsdp-train] TrainerParts::data ({}) and --data {} both name the training data; give "
             "one",
             parts.data ? parts.data->describe() : "", o.data.data);
  FSDP_CHECK(!o.data.pack || !o.data.data.empty(),
             "[fsdp-train] --pack packs the samples of a .jsonl --data or the documents of a text "
             "or shard --data; random data has neither");
  FSDP_CHECK(!o.data.pack || cfg.arch != nn::Arch::seed,
             "[fsdp-train] --pack needs causal attention (--arch {}): arch seed attends in both "
             "directions, across the samples of a row",
             nn::arch_name(nn::Arch::decoder));
  const bool pairs = !o.data.data.empty() && std::filesystem::is_regular_file(o.data.data) &&
                     data::names_preference_pairs(o.data.data);
  FSDP_CHECK(pairs || o.preference.preference.empty() || o.data.data.empty(),
             "[fsdp-train] --preference {}: --data {} is not a .jsonl of preference pairs (its "
             "first line has no \"chosen\" or \"rejected\")",
             o.preference.preference, o.data.data);
  FSDP_CHECK(!pairs || !o.preference.preference.empty(),
             "[fsdp-train] --data {} holds preference pairs (\"chosen\", \"rejected\"): train on "
             "them with --preference dpo, ipo, simpo or orpo",
             o.data.data);
  if (pairs) {  // two rows a pair, chosen then rejected, whole pairs on each rank
    FSDP_CHECK(cfg.batch % 2 == 0,
               "[fsdp-train] --batch {} rows per rank with --preference: a pair is two rows "
               "(chosen, rejected) and never split across ranks, so the rows per rank must be even",
               cfg.batch);
    FSDP_CHECK(tokenizer.has_value(), "[fsdp-train] --preference needs a tokenizer (--init-from "
               "a model, or --tokenizer)");
    const auto open_pairs = [&](const std::string& path) {
      return data::open_preference_pairs(
          path, *tokenizer, pretrained ? pretrained->chat_template : "", cfg.vocab, cfg.seq,
          pretrained ? pretrained->bos_id : std::nullopt,
          pretrained ? pretrained->eos_id : std::nullopt,
          pretrained ? checkpoint::chat_template_name(*pretrained) : "chat_template",
          o.preference.pref_truncation == "keep_end");
    };
    std::unique_ptr<data::PreferenceSource> p = open_pairs(o.data.data);
    if (!o.data.val_data.empty()) {  // validation pairs (the evaluation runs the preference loss)
      FSDP_CHECK(std::filesystem::is_regular_file(o.data.val_data) &&
                     data::names_preference_pairs(o.data.val_data),
                 "[fsdp-train] --val-data {} with --preference: expected a .jsonl of preference "
                 "pairs (its first line an object with \"chosen\" and \"rejected\")",
                 o.data.val_data);
      val = open_pairs(o.data.val_data);
    } else if (o.data.eval_every > 0) {  // the last pairs of --data
      std::unique_ptr<data::PreferenceSource> tail;
      std::tie(p, tail) = p->split_tail(o.data.val_fraction);
      val = std::move(tail);
    }
    if (o.data.shuffle) p->set_shuffle(o.run.seed);
    src = std::move(p);
  } else if (!o.data.data.empty() && data::is_jsonl(o.data.data)) {  // samples, one per row, masked
    std::unique_ptr<data::SampleSource> samples = open_samples(o.data.data);
    std::unique_ptr<data::SampleSource> tail;
    if (o.data.eval_every > 0 && o.data.val_data.empty())
      std::tie(samples, tail) = samples->split_tail(o.data.val_fraction);
    // Every step would compute a loss over nothing (it trained on, printing loss 0).
    FSDP_CHECK(samples->targets() > 0,
               "[fsdp-train] --data {}: no {}sample has a target token (no chat has an assistant "
               "turn, and no tokenized row a label other than -100), so no step would learn "
               "anything; give chats with assistant replies",
               o.data.data, tail ? "training " : "");
    if (o.data.pack) {  // packed rows, shuffled as rows
      std::unique_ptr<data::PackedSource> packed = samples->packed();
      if (o.data.shuffle) packed->set_shuffle(o.run.seed);
      src = std::move(packed);
      if (tail) val = tail->packed();
    } else {
      if (o.data.shuffle) samples->set_shuffle(o.run.seed);
      src = std::move(samples);
      val = std::move(tail);
    }
  } else if (!o.data.data.empty() && o.data.pack) {  // the documents, split at EOS, packed
    std::shared_ptr<data::TokenStream> stream = open_stream(o.data.data);
    const int32_t eos = pack_eos();
    if (o.data.eval_every > 0 && o.data.val_data.empty()) {
      auto [train, tail] = stream->split_tail(o.data.val_fraction, cfg.seq);
      stream = std::move(train);
      val = data::PackedSource::of_documents(std::move(tail), eos, cfg.seq);
    }
    std::unique_ptr<data::PackedSource> packed =
        data::PackedSource::of_documents(std::move(stream), eos, cfg.seq);
    if (o.data.shuffle) packed->set_shuffle(o.run.seed);
    src = std::move(packed);
  } else if (!o.data.data.empty()) {
    std::unique_ptr<data::TokenStream> stream = open_stream(o.data.data);
    if (o.data.shuffle) stream->set_shuffle(o.run.seed, cfg.seq);
    if (o.data.eval_every > 0 && o.data.val_data.empty()) {
      auto [train, tail] = stream->split_tail(o.data.val_fraction, cfg.seq);
      if (o.data.shuffle) train->set_shuffle(o.run.seed, cfg.seq);
      src = std::move(train);
      val = std::move(tail);
    } else {
      src = std::move(stream);
    }
    if (cfg.arch == nn::Arch::seed && main())
      fmt::print(stderr,
                 "warning: arch seed attends in both directions with no mask, so on text it "
                 "sees the next token it must predict; use --arch {} to learn a language "
                 "model\n",
                 nn::arch_name(nn::Arch::decoder));
  } else if (parts.data) {  // the caller's
    src = parts.data;
  } else {
    src = std::make_shared<data::RandomTokenSource>(cfg.vocab, o.run.seed);
    if (o.data.eval_every > 0)
      val = std::make_shared<data::RandomTokenSource>(cfg.vocab, o.run.seed + 1);
  }
  if (!o.data.val_data.empty() && !pairs)
    val = !data::is_jsonl(o.data.val_data)
              ? (o.data.pack ? std::shared_ptr<data::TokenSource>(data::PackedSource::of_documents(
                                   open_stream(o.data.val_data), pack_eos(), cfg.seq))
                             : std::shared_ptr<data::TokenSource>(open_stream(o.data.val_data)))
          : o.data.pack
              ? std::shared_ptr<data::TokenSource>(open_samples(o.data.val_data)->packed())
              : std::shared_ptr<data::TokenSource>(open_samples(o.data.val_data));
}

// The token that ends a document of a packed text or shard stream: --pack-eos, or the tokenizer's
// EOS.
int32_t Trainer::Impl::pack_eos() const {
  if (o.data.pack_eos >= 0) {
    FSDP_CHECK(o.data.pack_eos < cfg.vocab, "[fsdp-train] --pack-eos {} is not below the vocab {}",
               o.data.pack_eos, cfg.vocab);
    return int32_t(o.data.pack_eos);
  }
  const std::optional<int32_t> eos = tokenizer ? tokenizer->eos_id() : std::nullopt;
  FSDP_CHECK(eos.has_value(),
             "[fsdp-train] --pack on {} splits its documents after an end-of-sequence token, and "
             "{} names none: pass --pack-eos ID",
             o.data.data,
             tokenizer ? "the tokenizer (" + tokenizer->describe() + ")" : "no tokenizer");
  return *eos;
}

// A JSONL file of chats (rendered with the --init-from model's template) or tokenized rows.
std::unique_ptr<data::SampleSource> Trainer::Impl::open_samples(const std::string& spec) {
  return data::open_jsonl_samples(spec, tokenizer ? &*tokenizer : nullptr,
                                  pretrained ? pretrained->chat_template : "", cfg.vocab, cfg.seq,
                                  pretrained ? pretrained->bos_id : std::nullopt,
                                  pretrained ? pretrained->eos_id : std::nullopt,
                                  pretrained ? checkpoint::chat_template_name(*pretrained)
                                             : "chat_template");
}

// llm.c shards or bytes; a text file is encoded with the run's tokenizer when it is not bytes
// (a pretrained model's, say).
std::unique_ptr<data::TokenStream> Trainer::Impl::open_stream(const std::string& spec) {
  if (!tokenizer || tokenizer->is_bytes() || !is_text_file(spec))
    return data::open_token_stream(spec, cfg.vocab, cfg.seq);
  std::ifstream f(spec, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  std::vector<int32_t> ids = tokenizer->encode(text);
  // The tokenizer's framing of a text (a BOS, where its template has one) begins the stream.
  if (const auto bos = tokenizer->text_prefix_id(); bos && (ids.empty() || ids[0] != *bos))
    ids.insert(ids.begin(), *bos);
  FSDP_CHECK(int64_t(ids.size()) > cfg.seq,
             "[fsdp-train] --data {}: {} tokens with {}, fewer than --seq {} + 1", spec, ids.size(),
             tokenizer->describe(), cfg.seq);
  const std::string what =
      fmt::format("{} ({} tokens, encoded with the tokenizer)", spec, ids.size());
  return std::make_unique<data::TokenVector>(std::move(ids), what, cfg.seq);
}

// The tokenizer of the data: the --init-from model's, named, found beside .bin shards, or the
// bytes.
void Trainer::Impl::open_tokenizer() {
  namespace fs = std::filesystem;
  std::string path = o.data.tokenizer;
  if (path == "auto") {
    path = "bytes";
    if (!o.data.data.empty()) {
      fs::path p(o.data.data);
      const fs::path dir = fs::is_directory(p) ? p : p.parent_path();
      if (fs::exists(dir / "tokenizer.json") && o.data.data.find(".bin") != std::string::npos)
        path = (dir / "tokenizer.json").string();
      else if (fs::is_directory(p) && fs::exists(p / "tokenizer.json"))
        path = (p / "tokenizer.json").string();
    }
  }
  if (o.data.tokenizer == "auto" && o.data.data.empty() && cfg.vocab < 256)
    return;  // random ids below 256: no text, no tokenizer
  // A model whose own tokenizer could not be read must be given one: the bytes would be a guess.
  FSDP_CHECK(o.data.tokenizer != "auto" || path != "bytes" || o.data.data.empty() || !pretrained ||
                 pretrained->tokenizer_unread.empty(),
             "[fsdp-train] --init-from {}; give --tokenizer FILE.json (or a token .bin --data with "
             "its own)",
             pretrained ? pretrained->tokenizer_unread : "");
  model_tokenizer =
      o.data.tokenizer == "auto" && pretrained && pretrained->config && pretrained->tokenizer;
  if (model_tokenizer)
    tokenizer = *pretrained->tokenizer;  // the model's own
  else
    tokenizer = path == "bytes" ? data::Tokenizer::bytes() : data::Tokenizer::from_file(path);
}

}  // namespace fsdp::train
