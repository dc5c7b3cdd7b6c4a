// Reading GGUF files as llama.cpp writes them (v2 and v3, little-endian), for fine-tuning a
// pretrained model: the metadata, the tensor index, rows of a tensor dequantized to f32, and the
// tokenizer.
//
// Concept. A GGUF file is "GGUF", a version, a tensor count, a key/value count, the key/values
// (typed scalars, strings, arrays), the tensor infos (name, dims, ggml type, offset) and, at the
// next multiple of general.alignment (default 32), the data section. GgufFile maps the file
// read-only and parses everything but the data; tensor bytes are read from the mapping only when
// asked for, one row range at a time, so each FSDP rank dequantizes only its own shard and never
// holds the whole model.
//
// Dims. GGUF lists dims innermost first: ne[0] is the row length (the columns of a PyTorch
// weight), so a Linear weight [out, in] has ne = {in, out}. shape() is PyTorch's order
// (outermost first); a "row" is ne[0] consecutive elements, and rows() = ne[1] * ne[2] * ne[3].
// Quantized types pack a row as whole blocks (ne[0] is a multiple of the block size), so a row
// range is a byte range and dequantizes on its own.
//
// Invariants. Every malformed input is refused with an fsdp::Error naming the file, the key or
// tensor and the value: nothing is read out of bounds, and every count (keys, tensors, array
// lengths, string lengths, dims) is checked against the bytes left in the file before anything
// is allocated for it. Tensor data must lie inside the file, at an aligned offset.
//
// Dequantization follows ggml's block layouts (ggml-quants.c, gguf-py's gguf/quants.py) for F32,
// F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K, with the same float operations in the same order,
// so the values are bit-equal to gguf-py's dequantize (tests/gguf_test.py checks it). Other
// types are indexed (their sizes are known) but reading them is refused by name.
//
// Row order of attn_q / attn_k (the key decision). For the llama architecture, llama.cpp's
// convert_hf_to_gguf.py permutes the rows of Hugging Face's q_proj and k_proj per head,
// (n_head, 2, hd/2, dim) -> swap axes 1 and 2, so that llama.cpp's rope (pairs of neighbours,
// GPT-J style) gives what Hugging Face's rotate_half rope (pairs (i, i + hd/2), NEOX style) gave.
// fsdp.cpp's rope (kernels/cpu/rope.cpp) is Hugging Face's half-split form, and our own GGUF
// export (write_gguf) applies that same permutation. So a model loaded into fsdp.cpp wants
// Hugging Face's order:
//   RowOrder::file  rows exactly as stored (what gguf-py's GGUFReader gives);
//   RowOrder::hf    Hugging Face's order: where the converter permuted blk.N.attn_q.weight and
//                   attn_k.weight (the file's family says so: its state-dict adapter's
//                   gguf_half_split is false, as llama's), row r of the result is Hugging
//                   Face's row r, read from GGUF row gguf_row_of_hf(r, rows, heads) with
//                   <arch>.attention.head_count for q and head_count_kv for k; a half-split
//                   family's (qwen2's, qwen3's, gemma3's) were not permuted (the same rows); q/k
//                   of an architecture no family has are refused in this order (whether its
//                   converter permuted is not known here). Every other tensor: the same rows.
// read_rows() takes the order explicitly at every call; model loaders pass RowOrder::hf.
//
//   checkpoint::GgufFile f("SmolLM2-135M-Instruct.Q4_1.gguf");
//   Tensor w = f.read_rows("blk.0.attn_q.weight", 192, 384, checkpoint::RowOrder::hf);
//   data::Tokenizer tok = checkpoint::gguf_tokenizer(f);
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/dtype.h"
#include "fsdp/core/tensor.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/ops/rope.h"

namespace fsdp::checkpoint {

// ggml's tensor types that fsdp.cpp dequantizes (others are indexed, not read).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q4_K = 12,
  Q6_K = 14,
  BF16 = 30,
};
// "Q4_1", or "type 99" for a type ggml does not have.
std::string ggml_type_name(uint32_t type);
// Elements per block and bytes per block of a ggml type; {0, 0} when unknown.
std::pair<uint32_t, uint32_t> ggml_block(uint32_t type);
// Whether read_rows() can dequantize this type.
bool ggml_type_readable(uint32_t type);
// The types ggml_type_readable() accepts, for messages: "F32, F16, ..., Q4_K and Q6_K".
const char* ggml_readable_type_names();

// The value types of GGUF metadata, as numbered in the file.
enum class GgufType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// One metadata value. Scalars: integers and bools in `integer` (u64 above INT64_MAX is refused),
// floats in `real`, strings in `str`. Arrays (of one scalar type; arrays of arrays are refused):
// `array_type` and one of `integers`, `reals`, `strs`.
struct GgufValue {
  GgufType type = GgufType::u8;
  GgufType array_type = GgufType::u8;
  int64_t integer = 0;
  double real = 0;
  std::string str;
  std::vector<int64_t> integers;
  std::vector<double> reals;
  std::vector<std::string> strs;
  bool is_integer() const;  // an integer or bool scalar
  bool is_array() const { return type == GgufType::array; }
  size_t array_size() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // innermost first: ne[0] is the row length; 1 to 4 dims
  uint32_t type = 0;        // a ggml type (GgmlType for the ones read_rows dequantizes)
  uint64_t offset = 0;      // from the start of the data section
  uint64_t nbytes = 0;
  Shape shape() const;  // PyTorch's order: ne reversed
  int64_t row_length() const { return ne[0]; }
  int64_t rows() const;  // ne[1] * ne[2] * ne[3]
  int64_t numel() const { return rows() * row_length(); }
  uint64_t row_bytes() const;
};

enum class RowOrder { file, hf };

// Row `r` of Hugging Face's q_proj / k_proj (n_rows = n_head * head_dim) is row
// gguf_row_of_hf(r, n_rows, n_head) of the GGUF tensor (convert_hf_to_gguf.py's permutation).
int64_t gguf_row_of_hf(int64_t r, int64_t n_rows, int64_t n_head);

class GgufFile {
 public:
  // Maps and parses the file; throws naming the file and what is wrong.
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return path_; }
  // The mapping's resident pages given back (core/file.h release_mapped_pages).
  void release_pages() const;
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // of the data section, in the file

  // Metadata, keys in file order.
  const std::vector<std::string>& keys() const { return key_order_; }
  bool has(const std::string& key) const { return kv_.count(key) > 0; }
  const GgufValue& at(const std::string& key) const;  // throws naming the key when absent
  // Typed getters: throw naming the key and its type when absent or of another type
  // (get_int takes any integer or bool type; get_float also takes integers).
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  const std::string& get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  const std::vector<std::string>& get_strings(const std::string& key) const;
  const std::vector<int64_t>& get_ints(const std::string& key) const;
  const std::vector<double>& get_floats(const std::string& key) const;  // an array of floats

  // Tensors, in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return by_name_.count(name) > 0; }
  const GgufTensorInfo& tensor(const std::string& name) const;  // throws naming the file

  // Rows [row_begin, row_end) of tensor `name` as a [rows, ne[0]] tensor of `dtype` (f32, or f64
  // holding the same values), dequantizing only those rows' blocks. See the top of this file for
  // `order`. Throws naming the tensor for a range outside [0, rows()] or an unreadable type.
  Tensor read_rows(const std::string& name, int64_t row_begin, int64_t row_end, RowOrder order,
                   DType dtype = DType::f32) const;
  // The stored bytes of those rows (row_bytes() each, in `order`) into dst: a quantized tensor's
  // blocks as they are, for a base kept quantized (QLoRA).
  void read_row_bytes(const std::string& name, int64_t row_begin, int64_t row_end, RowOrder order,
                      uint8_t* dst) const;
  // The whole tensor in shape() (a 1-D norm comes back 1-D).
  Tensor read(const std::string& name, RowOrder order, DType dtype = DType::f32) const;
  // The raw bytes of tensor `name` in the mapping (valid while this GgufFile or a copy lives).
  const uint8_t* tensor_data(const std::string& name) const;

 private:
  int64_t permuted_heads(const std::string& name, RowOrder order) const;

  std::string path_;
  std::shared_ptr<const uint8_t> map_;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
};

// (llama.cpp's tensor names as Hugging Face's: the family's state-dict adapter,
// fsdp/models/state_dict_adapter.h, found by the file's general.architecture.)

// Dequantizes n elements (a multiple of the type's block size) of ggml type `type` from `src`
// (n / block elements * block bytes) into `dst`. Throws naming the type when it is not readable.
void dequantize_row(uint32_t type, const uint8_t* src, float* dst, int64_t n);

// The tokenizer of a GGUF file: tokenizer.ggml.model "gpt2" (byte-level BPE) with its tokens,
// merges and token types, or "llama" (SentencePiece BPE) with its tokens, scores and token types;
// and the special ids and chat template beside it.
struct GgufTokenizerInfo {
  std::string model;          // tokenizer.ggml.model
  std::string pre;            // tokenizer.ggml.pre ("smollm", "llama-bpe", "gpt-2", ...)
  std::string chat_template;  // tokenizer.chat_template, "" when absent
  std::optional<int32_t> bos, eos, pad, unk;
  bool add_bos = false, add_eos = false;
  // Hugging Face's tokenizer.json equivalent, as transformers 5 derives it: a BPE model with the
  // vocabulary and merges and the control (type 3) and user-defined (type 4) tokens as added
  // tokens (control ones special); "gpt2": the ByteLevel pre-tokenizer and decoder; "llama":
  // byte_fallback, merges rebuilt from the vocabulary (each token's splits into two tokens, best
  // first: by score, by file order for Gemma, whose scores follow it), spaces as U+2581 (Gemma:
  // a Replace normalizer and its runs of spaces spelled U+2581; others: Metaspace, a prefix
  // space on the text's first piece when tokenizer.ggml.add_space_prefix is not false).
  std::string tokenizer_json;
};
GgufTokenizerInfo gguf_tokenizer_info(const GgufFile& f);
// data::Tokenizer::from_json(gguf_tokenizer_info(f).tokenizer_json). Refuses, naming the value,
// a tokenizer.ggml.model other than "gpt2" and "llama", and for "gpt2" a tokenizer.ggml.pre other
// than "gpt-2" (GPT-2's split) and "smollm", "starcoder", "refact" (each number code point alone,
// then GPT-2's split: Hugging Face's Sequence [Digits(individual_digits), ByteLevel]); llama.cpp
// splits text with other regexes for the others. Its bos_id()/eos_id() are guessed from token names
// (<|endoftext|> for SmolLM2): take the GGUF's from GgufTokenizerInfo.
data::Tokenizer gguf_tokenizer(const GgufFile& f);

}  // namespace fsdp::checkpoint
