// Chat data for supervised fine-tuning: conversations rendered with the model's chat template,
// tokenized, and trained on the assistant's replies alone.
//
//   - ChatTemplate runs the model's own Jinja template (fsdp/data/jinja.h, the sandboxed engine)
//     as transformers' apply_chat_template does: the variables messages, add_generation_prompt,
//     bos_token and eos_token (the model's BOS and EOS tokens, else the tokenizer's; undefined
//     where there is none; no other special token is passed), tools and documents (none), and
//     the globals raise_exception and strftime_now. Whatever the template writes is the text,
//     whatever markers it holds or lacks: a template that upper-cases the content trains on the
//     upper-cased text, and one that raises an exception refuses the conversation with its
//     message. No marker is matched to render; the one use of markers left is
//     checkpoint::end_of_turn_id, the token that stops fsdp-generate --chat's answer.
//   - render() gives that text and the byte spans that are targets:
//       * a template with {% generation %} blocks: the bytes those blocks write (transformers'
//         return_assistant_tokens_mask);
//       * any other: each assistant turn's bytes, found by rendering the conversation twice, up
//         to the turn with the generation prompt (P: the turns before and the assistant's header)
//         and through it without (F). F must begin with P, and the whole conversation's text
//         with F up to the span's end, else the conversation is refused by name (Qwen3's template,
//         say, writes a reply that ends the conversation with an empty <think> block and one
//         that a user turn follows without, so no span of the text is that turn's). The span is
//         F's bytes after P, less the whitespace at their end (as Python's str.rstrip strips it):
//         the reply and its end-of-turn token ("hi<|im_end|>" of ChatML's
//         "<|im_start|>assistant\nhi<|im_end|>\n"; "hi<end_of_turn>" for Gemma 3;
//         "hi<|eot_id|>" for Llama 3.x), not the header, not the newline after the token.
//         The header is told apart only through the generation prompt: a template that ignores
//         add_generation_prompt but writes a header in the turn trains on that header too
//         (Mistral's [INST] templates write no header and no prompt, so nothing is lost there).
//         A conversation that opens with an assistant turn is refused where the template writes
//         something before the first turn only when there is one (SmolLM2's default system
//         turn): its text up to that turn is not a prefix of the conversation's.
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
namespace jinja {
class Template;
}

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};
using Conversation = std::vector<ChatMessage>;

// A Jinja template's text outside its {# ... #} comments: words in a comment render nothing (a
// Llama 3 template may mention ChatML in one).
std::string without_jinja_comments(const std::string& jinja_template);

struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> targets;  // [begin, end) byte spans of text
};

class ChatTemplate {
 public:
  // Parses `source` (throws, naming `name` and the line, for a syntax error or a construct the
  // engine refuses). bos_token and eos_token are the strings the template sees under those names;
  // none leaves the name undefined, as transformers does for a tokenizer without the token.
  ChatTemplate(const std::string& source, std::string name, std::optional<std::string> bos_token,
               std::optional<std::string> eos_token);
  // The template of a model: bos and eos are its ids (the model's own; none: the tokenizer's).
  static ChatTemplate of_model(const std::string& source, const Tokenizer& tok,
                               std::optional<int32_t> bos, std::optional<int32_t> eos,
                               std::string name = "chat_template");
  // The text alone (fsdp-generate's prompt: add_generation_prompt).
  std::string text(const Conversation& chat, bool add_generation_prompt) const;
  // The text and its target spans (above). Throws with the template's raise_exception message, a
  // limit's name, or the prefix rule's refusal; callers add the sample's file and line.
  RenderedChat render(const Conversation& chat) const;
  bool has_generation_blocks() const;
  const std::string& name() const;

 private:
  std::shared_ptr<const jinja::Template> template_;
  std::optional<std::string> bos_, eos_;
};

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

// The conversations of a {"messages": ...} JSONL file, and in `lines` (when given) each one's line
// number. Errors name the file, the line and the field, and what was expected.
std::vector<Conversation> read_chat_jsonl(const std::string& path,
                                          std::vector<int64_t>* lines = nullptr);

// One conversation of a JSONL file rendered with `chat` and tokenized; a refusal (the template's
// raise_exception, a limit, the prefix rule) is rethrown naming the file and the line.
TokenizedSample chat_sample(const std::string& path, int64_t line, const Tokenizer& tok,
                            const ChatTemplate& chat, const Conversation& conversation);

// A JSONL file of either form, tokenized: chat lines need `tok` (not bytes) and the model's
// `chat_template`, parsed at the first chat line (throws, saying which is missing, when either
// is), with `bos` and `eos` as its bos_token and eos_token (the model's; none: the tokenizer's);
// every id must be below `vocab`. `template_name` is what the template's messages call it (its
// file, or the field it came from).
std::unique_ptr<SampleSource> open_jsonl_samples(const std::string& path, const Tokenizer* tok,
                                                 const std::string& chat_template, int64_t vocab,
                                                 int64_t seq, std::optional<int32_t> bos = {},
                                                 std::optional<int32_t> eos = {},
                                                 const std::string& template_name = "chat_template");

}  // namespace fsdp::data
