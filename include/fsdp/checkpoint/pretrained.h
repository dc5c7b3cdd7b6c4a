// Pretrained models in, one code path: checkpoint::load_pretrained(path) opens a Hugging Face
// folder (config.json + model.safetensors, or model.safetensors.index.json over several files), a
// safetensors file (fsdp-export's, with its config in the metadata; one of a Hugging Face
// folder's, config.json beside it; or full weights in our own names, config from the caller) or a
// llama.cpp GGUF file, and returns what a trainer or a generator needs from it: the model's
// config (the family's: llama / qwen2 / qwen3 from config.json or GGUF metadata, minillm from our
// own metadata), the tokenizer (tokenizer.json beside the weights, or the GGUF's), the chat
// template and the special ids (BOS, EOS, end of turn).
//
// Key decision: nothing is read at open. Files are memory-mapped and a parameter's rows are read
// only when asked for: read_rows(name, a, b) gives rows [a, b) of dim 0 of OUR parameter `name`
// (GGUF: only those rows' blocks are dequantized, q/k rows in Hugging Face's order; safetensors:
// only those rows' bytes are touched and converted), assembling the packed in-projection from
// q/k/v. load_into(model, root) fills a fully_shard'ed model's local shards (each rank's rows of
// the Shard(0) chunk, torch.chunk's split), so no rank ever holds the whole model: at most one
// parameter's rows beyond its shard. Fill an unsharded model by leaving root null.
//
//   auto pre = checkpoint::load_pretrained("SmolLM2-135M-Instruct.Q4_1.gguf");
//   auto model = models::spec_to_train(*pre.config).build(*pre.config);  // its family's blocks
//   for (auto& b : model->layers()) fully_shard(b, mesh);
//   FSDPModule& root = fully_shard(*model, mesh);
//   pre.load_into(*model, &root);                     // this rank's rows only
//   std::string prompt = checkpoint::render_chat(pre, *pre.tokenizer, "Hi");
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/core/tensor.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/transformer.h"

namespace fsdp {
class FSDPModule;
}

namespace fsdp::checkpoint {

struct PretrainedSource;  // the mapped files (src/checkpoint/pretrained.cpp)

struct Pretrained {
  std::string path;
  std::string format;  // "gguf", "hf" (a Hugging Face folder or file), "safetensors" (ours)
  std::string family;  // "llama", "qwen2", "qwen3" (config.json's model_type; GGUF's architecture),
                       // "minillm" (fsdp-export's metadata), "" (our names, config from flags)
  std::optional<nn::TransformerConfig> config;  // nullopt: the file does not say (our names)
  std::optional<data::Tokenizer> tokenizer;  // nullopt: none beside the weights
  // Why the file's own tokenizer was not read ("" when it was, or when there is none): a GGUF's
  // SentencePiece vocabulary (tokenizer.ggml.model "llama", Gemma's). A caller then needs a
  // tokenizer given to it (or token ids), never the bytes in its place.
  std::string tokenizer_unread;
  std::string tokenizer_pre;                 // GGUF's tokenizer.ggml.pre ("smollm"), or derived
  std::string chat_template;                 // "" when the model has none
  // Where chat_template came from, as its messages name it: a file (chat_template.jinja, a
  // --chat-template file), a field ("tokenizer_config.json's chat_template", "model.gguf's
  // tokenizer.chat_template"); "" names it "chat_template".
  std::string chat_template_source;
  std::optional<int32_t> bos_id, eos_id;     // the model's own (not guessed from token names)
  std::optional<int32_t> eot_id;             // end of turn: <|im_end|> for ChatML, else EOS
  // The ids, template and pre-tokenizer name, as checkpoints and exports carry them.
  TokenizerMeta tokenizer_meta() const { return {bos_id, eos_id, chat_template, tokenizer_pre}; }

  // Rows [begin, end) of dim 0 of our parameter `name` for model config `cfg` (the packed
  // in-projection from q/k/v), in f32, shaped like the parameter with dim 0 = end - begin.
  // Throws naming the file and the tensor when it is absent or its shape does not fit.
  Tensor read_rows(const nn::TransformerConfig& cfg, const std::string& name, int64_t begin,
                   int64_t end) const;
  // The whole parameter; a zero-copy view of the mapping where the file holds it as it is (our
  // or Hugging Face's name, f32, not packed), else a new f32 tensor.
  Tensor read(const nn::TransformerConfig& cfg, const std::string& name) const;
  // Our 2-D parameter `name` as the GGUF stores it, for a base kept quantized (QLoRA,
  // FullyShardOptions::frozen_packed): a run of rows per stored tensor (q, k and v for the
  // in-projection), each of its ggml type and row bytes, decoded by dequantize_row. nullopt for
  // a 1-D parameter (norms stay f32) and for sources other than GGUF.
  std::optional<PackedRows> packed_rows(const nn::TransformerConfig& cfg,
                                        const std::string& name) const;
  // Fills every parameter of `model`: with `root` (fully_shard'ed), this rank's local rows of
  // each Shard(0) parameter (a packed one's stored bytes, the values checked finite as the
  // others' are); without, the whole tensors in place (p->data must be allocated).
  void load_into(nn::Transformer& model, FSDPModule* root = nullptr) const;
  // After load_into: the pages of the mapped model files (a GGUF, or a Hugging Face folder's
  // safetensors) that the load read are given back (the mapping stays; a later read refaults them
  // from the file), so that a training run does not hold the model file resident. A view from
  // read() that its holder wrote since reads the file's bytes again.
  void release_file_pages() const;

  std::shared_ptr<const PretrainedSource> source;
};

// Opens `path` (see the top of this file). Refuses, naming the path and the reason, a path that
// does not exist, a folder with no weights, a GGUF of another architecture, and a config the
// model cannot hold.
Pretrained load_pretrained(const std::string& path);

// What the pretrained model at `path` is by content (data::data_identity of the file, or of each
// regular file of a folder, by name): a LoRA run's checkpoints leave the base out and name it by
// this, and a resume or an export refuses a base whose content differs.
std::string model_identity(const std::string& path);

// The model config of a config.json's model_type: the family's reader (models::ModelSpec, one per
// folder of src/models/: llama, qwen2, qwen3, gemma3_text), or "minillm" for our own config JSON.
// Refuses another model_type by name, listing the known ones. The config names its family
// (models::named_config), so that the checkpoints and exports of a run from it say which it is.
nn::TransformerConfig config_from_family(const std::string& family, const std::string& config_json,
                                         const std::string& where);

// The model config of a GGUF file: the family of its general.architecture reads it
// (models::ModelSpec::read_gguf_config: llama, with experts Mixtral's, qwen2, qwen3, gemma3,
// qwen3moe); another architecture, or one whose family reads no GGUF, is refused by name. The
// config names its family (models::named_config).
nn::TransformerConfig config_from_gguf(const GgufFile& f);

// The chat template of a Jinja file in place of the model's own (Gemma 3's base GGUF ships none:
// its instruct template), and the end of turn it implies. Throws naming the file.
void set_chat_template(Pretrained& p, const std::string& jinja_file);
// What a chat template's messages call it: p.chat_template_source, or "chat_template".
std::string chat_template_name(const Pretrained& p);

// The end-of-turn id of a chat template, the token that ends the answer of fsdp-generate --chat:
// ChatML's <|im_end|>, Gemma's <end_of_turn> or Llama 3's <|eot_id|> where the template's text
// (outside its comments) names it and the vocabulary has it, else `eos`. It only stops generation;
// the prompt and the training text are the template's own rendering (render_chat).
std::optional<int32_t> end_of_turn_id(const data::Tokenizer& tok, const std::string& chat_template,
                                      std::optional<int32_t> eos);

// The first user turn of a chat (after `system`, when given), rendered by `p`'s chat template with
// add_generation_prompt, as transformers' apply_chat_template renders it (data::ChatTemplate: the
// template runs in the sandboxed Jinja engine, with p's BOS and EOS tokens, else tok's, as
// bos_token and eos_token). Throws the template's raise_exception message, naming the template.
std::string render_chat(const Pretrained& p, const data::Tokenizer& tok, const std::string& user,
                        const std::optional<std::string>& system = std::nullopt);

}  // namespace fsdp::checkpoint
