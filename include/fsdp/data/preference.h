// Paired preference data (TRL's preference format) for DPO, IPO and SimPO (train/preference.h):
// each JSONL line is a prompt with a chosen and a rejected reply, in either of TRL's forms:
//   {"prompt": "...", "chosen": "...", "rejected": "..."}                       standard
//   {"prompt": [messages], "chosen": [messages], "rejected": [messages]}         conversational
// where the conversational form's messages are {"role", "content"} and are rendered with the
// model's chat template (data::ChatTemplate).
//
// Tokenized as TRL 1.16's DPOTrainer does (_prepare_dataset): standard, the tokenizer's EOS text is
// appended to a reply that does not end with it, and "prompt" and "prompt + reply" are encoded
// (with the tokenizer's text framing: Llama's BOS); conversational, the prompt is rendered with
// the generation prompt and the prompt followed by the reply without it, and both texts encoded
// (apply_chat_template adds no special token). The reply starts where the prompt's tokens and the
// prompt-and-reply's first differ (TRL's common_prefix_length, over both replies), so the prompt's
// tokens are the same in both rows. A sequence longer than seq + 1 tokens (a row's seq positions)
// is cut as TRL's collator cuts at max_length (= seq + 1): at its end under truncation_mode
// "keep_start" (TRL's default), or at its start under "keep_end" (the prompt's start goes first,
// each row on its own); the count of pairs cut is in describe(). Under keep_start a prompt that
// leaves no reply token in a row (longer than --seq tokens: TRL drops it) is refused, naming the
// file and the line.
//
// Row layout: pair k is two consecutive rows, chosen then rejected, the reply's tokens the only
// targets. Window q of the run is row q mod 2 of pair q / 2 (mod the pairs; with the shuffle, the
// pairs in shuffle_window's order each epoch), so a batch of an even number of rows starting at an
// even window holds whole pairs, and the DataLoader, which hands each rank contiguous rows, never
// splits a pair when each rank's rows are even (the trainer checks).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/data/chat.h"
#include "fsdp/data/token_sources.h"

namespace fsdp::data {

class Tokenizer;

struct PreferencePair {
  std::vector<int32_t> prompt, chosen, rejected;  // the prompt's tokens, then each reply's
};

class PreferenceSource : public TokenSource {
 public:
  PreferenceSource(std::vector<PreferencePair> pairs, std::string description, int32_t pad,
                   int64_t seq, bool keep_end = false);
  // Rows [first, first + rows): first and rows must be even (whole pairs). With set_reference,
  // each row's reference log-prob comes with them (Batch::reference_logps).
  Batch windows(int64_t first, int64_t rows, int64_t seq) const override;
  // The rows of pairs [first, first + count) in the file's order (no shuffle; past the last pair
  // they wrap to the first), for a pass over every pair (the reference's log-probs).
  Batch pair_rows(int64_t first, int64_t count, int64_t seq) const;
  // The pairs' reference log-probs, 2 a pair (chosen, rejected), which windows() hands out.
  void set_reference(std::vector<double> logps);
  bool has_reference() const { return !reference_.empty(); }
  // FNV-1a over every pair's tokens (prompt, chosen, rejected, with their lengths), the seq and
  // the truncation: what the rows are made of, whatever file, template or split made them.
  uint64_t content_hash() const;
  std::string describe() const override;
  bool masks_targets() const override { return true; }
  int64_t pairs() const { return int64_t(pairs_.size()); }
  int64_t truncated(int64_t seq) const;  // pairs with a sequence longer than seq + 1 tokens
  void set_shuffle(uint64_t seed);
  // The first pairs and the last round(fraction x pairs) (at least 1 each), as SampleSource's
  // split_tail: the training and the validation pairs.
  std::pair<std::unique_ptr<PreferenceSource>, std::unique_ptr<PreferenceSource>> split_tail(
      double fraction) const;

 private:
  std::vector<PreferencePair> pairs_;
  std::string description_;
  int32_t pad_ = 0;
  int64_t seq_ = 0;
  bool keep_end_ = false;  // TRL's truncation_mode "keep_end": a long row keeps its last tokens
  bool shuffle_ = false;
  uint64_t seed_ = 0;
  std::vector<double> reference_;  // set_reference's, 2 a pair
  // Pair k's row (chosen: which 0, rejected: 1) into in[seq] and tg[seq].
  void fill_row(int64_t k, int which, int64_t seq, int32_t* in, int32_t* tg) const;
};

// Whether `path`'s first line is a preference pair (an object with "chosen" or "rejected").
bool names_preference_pairs(const std::string& path);

// The pairs of a JSONL file, tokenized as above. Conversational lines need the model's
// `chat_template` (and a tokenizer that is not bytes); `bos` and `eos` are its bos_token and
// eos_token (none: the tokenizer's). Every line is checked: a missing or mistyped field, an empty
// reply, a prompt that fills --seq (keep_start), an id outside `vocab` is refused naming the file,
// the line and the field. keep_end: TRL's truncation_mode "keep_end".
std::unique_ptr<PreferenceSource> open_preference_pairs(
    const std::string& path, const Tokenizer& tok, const std::string& chat_template, int64_t vocab,
    int64_t seq, std::optional<int32_t> bos = {}, std::optional<int32_t> eos = {},
    const std::string& template_name = "chat_template", bool keep_end = false);

}  // namespace fsdp::data
