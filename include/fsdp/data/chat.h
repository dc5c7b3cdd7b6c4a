// Chat data for supervised fine-tuning: conversations rendered with the model's chat template,
// tokenized, and trained on the assistant's replies alone.
//
//   - ChatFormat::recognize() reads a model's chat template (its Jinja text, never executed) and
//     names the format it writes: ChatML (<|im_start|>role\n...<|im_end|>\n: SmolLM2, Qwen2.5),
//     with the template's own default system turn, or Gemma's (<bos>, then
//     <start_of_turn>user|model\n{content, trimmed}<end_of_turn>\n, the roles alternating and
//     the system message before the first user turn's content: Gemma 3's instruct template), or
//     Llama 3's headers (<|begin_of_text|>, then
//     <|start_header_id|>role<|end_header_id|>\n\n{content, trimmed}<|eot_id|>: Llama 3.0's
//     template, and 3.1's to 3.3's, which always open with a system block that holds the knowledge
//     cutoff and a date, the template's fixed one or, where it calls strftime_now, today's as
//     transformers writes it, "%d %b %Y" in local time). Any other template is refused by name; a
//     conversation in another format reaches training as tokenized rows (below), which any
//     renderer can write.
//   - render() gives the text, token for token what transformers' apply_chat_template gives, and
//     the byte spans that are targets: each assistant turn's content and its end-of-turn token
//     (<|im_end|>, <end_of_turn>, <|eot_id|>). The newline after it is not a target, nor is the
//     header ("<|im_start|>assistant\n", "<start_of_turn>model\n",
//     "<|start_header_id|>assistant<|end_header_id|>\n\n").
//   - tokenize_chat() encodes the whole text once (never piece by piece, which would split BPE
//     merges at the turns' edges) and marks a token a target when any of its bytes lies in a span,
//     as transformers' return_assistant_tokens_mask does.
//
// A JSONL file is one sample per line, in either form (open_jsonl_samples):
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//       Hugging Face's and OpenAI's chat form, multi-turn, an optional system turn first;
//   {"input_ids": [...], "labels": [...]}
//       tokenized rows, Hugging Face's form: a label is -100 (not trained on) or the id itself;
//       no "labels" means every token is a target.
// SampleSource batches them one sample per row: a sample longer than seq + 1 tokens is cut there
// (the count is in describe()), a shorter one is padded, and padding is never a target. Row q of
// the run is sample q mod N, or with the shuffle sample shuffle_window(q mod N, N, seed, q / N):
// each epoch visits every sample once. The position a checkpoint saves counts samples, so a
// resume at another world size goes on from the next unread one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/data/token_sources.h"

namespace fsdp::data {

class Tokenizer;

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};
using Conversation = std::vector<ChatMessage>;

// A Jinja template's text outside its {# ... #} comments: words in a comment render nothing (a
// Llama 3 template may mention ChatML in one).
std::string without_jinja_comments(const std::string& jinja_template);

class ChatFormat {
 public:
  enum class Kind { chatml, gemma, llama3 };
  // Throws, quoting the template's start, for a template whose format is not one of Kind's.
  static ChatFormat recognize(const std::string& jinja_template);
  Kind kind() const { return kind_; }
  std::string name() const;                // "ChatML", "Gemma", "Llama 3"
  const std::string& end_of_turn() const;  // "<|im_end|>", "<end_of_turn>", "<|eot_id|>"
  // The system turn the template writes when the conversation has none (SmolLM2's "You are a
  // helpful AI assistant named SmolLM, ..."); none when the template writes none.
  const std::optional<std::string>& default_system() const { return default_system_; }
  // Llama 3.1's to 3.3's system block: the text before the system message
  // ("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"), written whether or not
  // the conversation has a system turn; none for Llama 3.0's template, which writes no block.
  const std::optional<std::string>& system_preamble() const { return system_preamble_; }

 private:
  Kind kind_ = Kind::chatml;
  std::optional<std::string> default_system_, system_preamble_;
};

struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> targets;  // [begin, end) byte spans of text
};
// Throws for a role other than system, user or assistant, or a system turn after the first.
RenderedChat render(const ChatFormat& format, const Conversation& chat,
                    bool add_generation_prompt = false);

struct TokenizedSample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> target;  // target[i]: ids[i] is a label (predicted from ids[0..i))
};
TokenizedSample tokenize_chat(const Tokenizer& tok, const RenderedChat& chat);

class PackedSource;

// Samples, one per row, with a loss mask (TokenSource::masks_targets).
class SampleSource : public TokenSource {
 public:
  // `pad` fills the inputs after a sample's end (a causal model never attends forward to it).
  SampleSource(std::vector<TokenizedSample> samples, std::string description, int32_t pad,
               int64_t seq);
  Batch windows(int64_t first, int64_t rows, int64_t seq) const override;
  std::string describe() const override;
  bool masks_targets() const override { return true; }
  int64_t size() const { return end_ - begin_; }  // samples
  int64_t targets() const;           // labels over all samples, before any cut
  int64_t longer_than(int64_t seq) const;  // samples cut at seq + 1 tokens
  void set_shuffle(uint64_t seed);
  // The last `fraction` of the samples (at least one) as a validation source; both unshuffled.
  std::pair<std::unique_ptr<SampleSource>, std::unique_ptr<SampleSource>> split_tail(
      double fraction) const;
  // The same samples packed into rows of seq (below), unshuffled.
  std::unique_ptr<PackedSource> packed() const;

 private:
  SampleSource(std::shared_ptr<const std::vector<TokenizedSample>> all, int64_t begin, int64_t end,
               std::string description, int32_t pad, int64_t seq);
  std::shared_ptr<const std::vector<TokenizedSample>> samples_;
  int64_t begin_ = 0, end_ = 0;  // this source's samples in samples_
  std::string description_;
  int32_t pad_ = 0;
  int64_t seq_ = 0;
  bool shuffle_ = false;
  uint64_t seed_ = 0;
};

// Samples packed into rows (--pack), as Hugging Face's DataCollatorWithFlattening and torchtune's
// PackedDataset pack them: whole samples, in the file's order, fill a row of seq positions until
// the next one does not fit, and the rest of the row is padding (never a target). A sample of n
// tokens takes n - 1 positions (inputs ids[0, n-1), targets ids[1, n) where they are targets), just
// what its unpacked row trains on. One longer than seq positions is split into pieces of seq, each
// a document of its own (split() counts the samples split; the unpacked rows cut them instead).
// Batch::doc_start gives each position its document's first position in the row (the padding is a
// document of its own), so attention never crosses a sample and rotary positions restart in each.
// The rows are made once, at construction; with the shuffle, row q of the run is packed row
// shuffle_window(q mod R, R, seed, q / R) of the R rows, so each epoch visits every row once and
// the position a checkpoint saves counts packed rows.
// A text corpus or llm.c's shards pack the same way (of_documents): the stream is cut into
// documents after each `eos` token (which ends its document; llm.c's shards, which begin each
// document with it, then end the one before), every token a target. Only the documents' starts
// are held (the tokens are read from the stream when a batch needs them), so the memory is 8
// bytes a document plus the rows' pieces, not the corpus.
class PackedSource : public TokenSource {
 public:
  static std::unique_ptr<PackedSource> of_documents(std::shared_ptr<const TokenStream> stream,
                                                    int32_t eos, int64_t seq);
  Batch windows(int64_t first, int64_t rows, int64_t seq) const override;  // seq: the packing's
  std::string describe() const override;
  bool masks_targets() const override { return true; }
  int64_t rows() const { return int64_t(row_begin_.size()) - 1; }  // packed rows per epoch
  int64_t samples() const { return samples_packed_; }  // with at least one position (2 tokens)
  int64_t split() const { return split_; }             // samples longer than seq positions
  double fill() const;                                 // share of positions that hold a token
  void set_shuffle(uint64_t seed);

 private:
  friend class SampleSource;
  PackedSource(std::shared_ptr<const std::vector<TokenizedSample>> all, int64_t begin, int64_t end,
               std::string description, int32_t pad, int64_t seq);
  PackedSource(std::string description, int32_t pad, int64_t seq);
  // Packs the samples in order, sample k having n(k) tokens.
  template <class Length>
  void pack(int64_t begin, int64_t end, Length n);
  struct Piece {
    int64_t sample, offset, length;  // positions [offset, offset + length) of the sample
  };
  std::shared_ptr<const std::vector<TokenizedSample>> all_;
  std::shared_ptr<const TokenStream> stream_;  // of_documents: document k is tokens
  std::vector<int64_t> doc_begin_;             // [doc_begin_[k], doc_begin_[k + 1]) of it
  std::vector<Piece> pieces_;       // row by row
  std::vector<int64_t> row_begin_;  // row r holds pieces_[row_begin_[r], row_begin_[r + 1])
  std::string description_;
  int32_t pad_ = 0;
  int64_t seq_ = 0, samples_packed_ = 0, split_ = 0, positions_ = 0;
  bool shuffle_ = false;
  uint64_t seed_ = 0;
};

// Whether `path` is a JSONL file of samples, by its name (*.jsonl, any case) or its content (a
// first line that is an object with "messages" or "input_ids"); a .json file of another form is
// refused naming the form.
bool is_jsonl(const std::string& path);

// The conversations of a {"messages": ...} JSONL file. Errors name the file, the line and the
// field, and what was expected.
std::vector<Conversation> read_chat_jsonl(const std::string& path);

// A JSONL file of either form, tokenized: chat lines need `tok` (not bytes) and the model's
// `chat_template`, recognized at the first chat line (throws, saying which is missing, when either
// is); every id must be below `vocab`.
std::unique_ptr<SampleSource> open_jsonl_samples(const std::string& path, const Tokenizer* tok,
                                                 const std::string& chat_template, int64_t vocab,
                                                 int64_t seq);

}  // namespace fsdp::data
