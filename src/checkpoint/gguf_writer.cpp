// GGUF v3 for llama.cpp (write_gguf): our names -> llama.cpp's and its architecture's keys, as the
// family's state-dict adapter says (q and k rows permuted from Hugging Face's half-split rotary
// pairs to llama.cpp's neighbouring ones where its converter does so, norms stored as 1 + w where
// it does that), an MoE's stacked experts as llama.cpp's 3-D tensors, 1-D tensors kept F32, and
// the tokenizer as a "gpt2" or SentencePiece vocabulary.
// The file is written whole through write_file_atomic.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/core/file.h"
#include "fsdp/models/spec.h"
#include "fsdp/models/state_dict_adapter.h"
#include "src/checkpoint/gguf_format_names.h"

namespace fsdp::checkpoint {

using models::is_in_proj;
using models::is_in_proj_bias;
using models::Naming;

namespace {

constexpr size_t kAlign = 32;

enum GgufType : uint32_t { U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STR = 8, ARR = 9 };

class GgufWriter {
 public:
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void f32(float v) { raw(&v, 4); }
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void kv_u32(const std::string& k, uint32_t v) { str(k), u32(U32), u32(v), ++n_kv; }
  void kv_f32(const std::string& k, float v) { str(k), u32(F32), f32(v), ++n_kv; }
  void kv_bool(const std::string& k, bool v) {
    str(k), u32(BOOL), buf.push_back(v ? 1 : 0), ++n_kv;
  }
  void kv_str(const std::string& k, const std::string& v) { str(k), u32(STR), str(v), ++n_kv; }
  void kv_strs(const std::string& k, const std::vector<std::string>& v) {
    str(k), u32(ARR), u32(STR), u64(v.size());
    for (const std::string& x : v) str(x);
    ++n_kv;
  }
  void kv_i32s(const std::string& k, const std::vector<int32_t>& v) {
    str(k), u32(ARR), u32(I32), u64(v.size());
    raw(v.data(), v.size() * 4);
    ++n_kv;
  }
  void kv_f32s(const std::string& k, const std::vector<float>& v) {
    str(k), u32(ARR), u32(F32), u64(v.size());
    raw(v.data(), v.size() * 4);
    ++n_kv;
  }
  void raw(const void* p, size_t n) {
    buf.insert(buf.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
  }
  void pad(size_t align) { buf.resize((buf.size() + align - 1) / align * align, 0); }
  std::vector<char> buf;
  uint64_t n_kv = 0;
};

uint32_t ggml_type(DType t) {
  switch (t) {
    case DType::f32:
      return 0;
    case DType::f16:
      return 1;
    case DType::bf16:
      return 30;
    default:
      FSDP_FAIL("[gguf] tensors are F32, F16 or BF16, not {}", dtype_name(t));
  }
}

// Hugging Face's half-split q/k rows -> llama.cpp's neighbouring pairs, per head (a bias is one
// column).
Tensor permute_for_gguf(const Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0), cols = w.dim() == 2 ? w.size(1) : 1, hd = rows / heads;
  return w.contiguous().view({heads, 2, hd / 2, cols}).transpose(1, 2).contiguous().view(w.shape());
}

// The adapter of cfg's family (models::spec_of), refusing a family without a llama.cpp
// architecture (seed) and a config its architecture would load as another model (the spec's
// check_gguf).
const models::StateDictAdapter& gguf_adapter(const nn::TransformerConfig& cfg) {
  const models::ModelSpec& spec = models::spec_of(cfg);
  FSDP_CHECK(spec.adapter && !spec.adapter->gguf_arch.empty(),
             "[gguf] the {} family has no llama.cpp architecture ({})", spec.name, spec.what);
  if (spec.check_gguf) spec.check_gguf(cfg);
  return *spec.adapter;
}

// Writes the header, the tensors' table and their data, each aligned, through write_file_atomic.
void write_file(const std::string& path, const GgufWriter& kv,
                const std::vector<std::pair<std::string, Tensor>>& tensors) {
  GgufWriter w;
  w.raw("GGUF", 4);
  w.u32(3);
  w.u64(tensors.size());
  w.u64(kv.n_kv);
  w.raw(kv.buf.data(), kv.buf.size());
  uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    w.str(name);
    w.u32(uint32_t(t.dim()));
    for (int i = t.dim() - 1; i >= 0; --i)
      w.u64(uint64_t(t.size(i)));  // ne[0] is the innermost dim
    w.u32(ggml_type(t.dtype()));
    w.u64(offset);
    offset += (t.nbytes() + kAlign - 1) / kAlign * kAlign;
  }
  w.pad(kAlign);
  for (auto& [name, t] : tensors) {
    w.raw(t.raw_data(), t.nbytes());
    w.pad(kAlign);
  }
  write_file_atomic(path, std::string_view(w.buf.data(), w.buf.size()), "[gguf]");
}

}  // namespace

void write_gguf(const std::string& path, const nn::TransformerConfig& cfg, const NamedTensors& ours,
                DType dtype, const data::Tokenizer& tok, const TokenizerMeta& meta) {
  // (Named, not structured bindings: lambdas below capture them.)
  const models::StateDictAdapter& names = gguf_adapter(cfg);
  const std::string arch(names.gguf_arch);
  const bool half_split = names.gguf_half_split;
  // Tensors in llama.cpp's names; 1-D norms (and biases) stay F32 as llama.cpp's converter keeps
  // them. A tied model has no output.weight: llama.cpp then uses token_embd.weight.
  std::vector<std::pair<std::string, Tensor>> tensors;
  // What the family's converter adds beside the parameters (the rope's factors), first.
  if (names.gguf_extra_tensors) tensors = names.gguf_extra_tensors(cfg);
  const auto rows = in_proj_rows(cfg);
  const int64_t kv_heads = cfg.resolved_kv_heads();
  auto qk = [&](const Tensor& t, int64_t heads) {
    return half_split ? t : permute_for_gguf(t, heads);
  };
  for (auto& [name, t] : ours) {
    const bool is_vec = t.dim() == 1;
    auto add = [&](const std::string& n, const Tensor& x) {
      Tensor out = x.contiguous().to(is_vec ? DType::f32 : dtype);
      // llama.cpp's converter stores (1 + w) norms as 1 + w.
      if (names.gguf_norm_plus_one && is_vec && n.ends_with("norm.weight")) {
        out = out.clone();
        float* v = out.data<float>();
        for (int64_t i = 0; i < out.numel(); ++i) v[i] += 1.0f;
      }
      tensors.emplace_back(n, out);
    };
    if (is_in_proj(name) || is_in_proj_bias(name)) {
      const auto qkv = names.in_proj_names(name, Naming::gguf);
      add(qkv[0], qk(t.slice(rows[0].first, rows[0].second), cfg.heads));
      add(qkv[1], qk(t.slice(rows[1].first, rows[1].second), kv_heads));
      add(qkv[2], t.slice(rows[2].first, rows[2].second));
    } else {
      const std::string n = names.rename(name, Naming::ours, Naming::gguf);
      FSDP_CHECK(!n.empty(), "[gguf] no llama.cpp name for parameter '{}'", name);
      add(n, t);
    }
  }
  GgufWriter kv;
  kv.kv_str("general.architecture", arch);
  kv.kv_str("general.name", "fsdp.cpp " + arch);
  kv.kv_u32("general.alignment", kAlign);
  kv.kv_u32("general.file_type", dtype == DType::f32 ? 0 : dtype == DType::f16 ? 1 : 32);
  const std::string a = arch + ".";
  kv.kv_u32(a + "vocab_size", uint32_t(cfg.vocab));
  kv.kv_u32(a + "context_length", uint32_t(cfg.seq));
  kv.kv_u32(a + "embedding_length", uint32_t(cfg.dim));
  kv.kv_u32(a + "block_count", uint32_t(cfg.layers));
  // A mixture of experts: its sizes; the experts' width in expert_feed_forward_length beside the
  // dense blocks' (as llama.cpp's architecture "qwen3moe" keys it), or as feed_forward_length
  // itself (as its architecture "llama" does with experts).
  const bool experts_in_ffn_key = cfg.moe.enabled() && !names.gguf_expert_ffn_key;
  kv.kv_u32(a + "feed_forward_length",
            uint32_t(experts_in_ffn_key ? cfg.moe.hidden : cfg.resolved_ffn_hidden()));
  if (cfg.moe.enabled()) {
    kv.kv_u32(a + "expert_count", uint32_t(cfg.moe.experts));
    kv.kv_u32(a + "expert_used_count", uint32_t(cfg.moe.top_k));
    if (names.gguf_expert_ffn_key)
      kv.kv_u32(a + "expert_feed_forward_length", uint32_t(cfg.moe.hidden));
  }
  kv.kv_u32(a + "rope.dimension_count", uint32_t(cfg.resolved_head_dim()));
  kv.kv_u32(a + "attention.head_count", uint32_t(cfg.heads));
  kv.kv_u32(a + "attention.head_count_kv", uint32_t(kv_heads));
  kv.kv_u32(a + "attention.key_length", uint32_t(cfg.resolved_head_dim()));
  kv.kv_u32(a + "attention.value_length", uint32_t(cfg.resolved_head_dim()));
  kv.kv_f32(a + "attention.layer_norm_rms_epsilon",
            float(cfg.norm_eps.value_or(1.1920928955078125e-07)));
  kv.kv_f32(a + "rope.freq_base", float(cfg.rope_theta));
  if (names.gguf_sliding_window && cfg.sliding_window > 0)
    kv.kv_u32(a + "attention.sliding_window", uint32_t(cfg.sliding_window));
  // The tokenizer, as llama.cpp's "gpt2" (byte-level BPE) model with GPT-2's split, or its
  // "llama" (SentencePiece) model with scores in the merges' order.
  FSDP_CHECK(tok.size() <= cfg.vocab, "[gguf] the tokenizer has {} ids but the model only {}",
             tok.size(), cfg.vocab);
  enum TokenType : int32_t { NORMAL = 1, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6 };
  const bool spm = tok.is_sentencepiece();
  std::vector<std::string> tokens(tok.tokens());
  std::vector<int32_t> types;
  std::vector<float> scores;
  for (int32_t i = 0; i < int32_t(tok.size()); ++i) {
    std::string& t = tokens[size_t(i)];
    int32_t type = tok.is_special(i) ? CONTROL : tok.is_added(i) ? USER_DEFINED : NORMAL;
    if (spm && type == NORMAL) {
      if (data::byte_token_value(t) >= 0 && tok.token_bytes(i).size() == 1) type = BYTE;
      // Runs of spaces, which transformers spells U+2581 (gguf_tokenizer_info): a file spelled
      // by id (gguf_spm_by_id) holds them as spaces, and llama.cpp matches them whole, as
      // user-defined tokens.
      const std::string meta = "\u2581";
      if (names.gguf_spm_by_id && t.size() >= 2 * meta.size() && t.size() % meta.size() == 0) {
        bool run = true;
        for (size_t k = 0; run && k < t.size(); k += meta.size())
          run = t.compare(k, meta.size(), meta) == 0;
        if (run) {
          t = std::string(t.size() / meta.size(), ' ');
          type = USER_DEFINED;
        }
      }
    }
    types.push_back(type);
    // llama.cpp's SentencePiece merges the pair whose token scores highest: the merges' order is
    // the vocabulary's, best first (every SentencePiece BPE's).
    scores.push_back(type == NORMAL ? -float(i) : 0.0f);
  }
  std::optional<int32_t> bos = meta.bos ? meta.bos : tok.bos_id(),
                         eos = meta.eos ? meta.eos : tok.eos_id();
  for (int64_t i = tok.size(); i < cfg.vocab; ++i) {
    tokens.push_back(fmt::format("<unused{}>", i));
    types.push_back(UNUSED);
    scores.push_back(0.0f);
  }
  if (!bos && !eos && cfg.vocab >= tok.size() + 2) {  // ids the model never saw: never produced
    bos = int32_t(tok.size());
    eos = int32_t(tok.size() + 1);
    tokens[size_t(*bos)] = "<|bos|>";
    tokens[size_t(*eos)] = "<|endoftext|>";
    types[size_t(*bos)] = types[size_t(*eos)] = CONTROL;
  }
  if (spm) {
    kv.kv_str("tokenizer.ggml.model", std::string(gguf_format::kSentencePiece));
    kv.kv_strs("tokenizer.ggml.tokens", tokens);
    kv.kv_f32s("tokenizer.ggml.scores", scores);
    kv.kv_i32s("tokenizer.ggml.token_type", types);
    kv.kv_bool("tokenizer.ggml.add_space_prefix", tok.prefixes_space());
  } else {
    std::vector<std::string> merges = tok.merges();
    if (merges.empty()) merges.push_back("a 1");
    kv.kv_str("tokenizer.ggml.model", std::string(gguf_format::kByteLevelBpe));
    kv.kv_str("tokenizer.ggml.pre", meta.pre.empty() ? std::string(gguf_format::kGpt2Split) : meta.pre);
    kv.kv_strs("tokenizer.ggml.tokens", tokens);
    kv.kv_i32s("tokenizer.ggml.token_type", types);
    kv.kv_strs("tokenizer.ggml.merges", merges);
  }
  if (bos) kv.kv_u32("tokenizer.ggml.bos_token_id", uint32_t(*bos));
  if (eos) kv.kv_u32("tokenizer.ggml.eos_token_id", uint32_t(*eos));
  if (const auto unk =
          spm ? std::find(tok.tokens().begin(), tok.tokens().end(), "<unk>") : tok.tokens().end();
      unk != tok.tokens().end())
    kv.kv_u32("tokenizer.ggml.unknown_token_id", uint32_t(unk - tok.tokens().begin()));
  kv.kv_bool("tokenizer.ggml.add_bos_token", tok.text_prefix_id().has_value());
  kv.kv_bool("tokenizer.ggml.add_eos_token", false);
  if (!meta.chat_template.empty()) kv.kv_str("tokenizer.chat_template", meta.chat_template);

  write_file(path, kv, tensors);
}

void write_gguf_lora(const std::string& path, const nn::TransformerConfig& cfg,
                     const NamedTensors& with_adapters) {
  FSDP_CHECK(cfg.lora.enabled(), "[gguf] a LoRA adapter GGUF needs a model with LoRA adapters");
  const models::StateDictAdapter& names = gguf_adapter(cfg);
  const std::string arch(names.gguf_arch);
  const bool half_split = names.gguf_half_split;
  // llama.cpp's convert_lora_to_gguf layout: for each adapted weight W of the base ("blk.0.attn_q.
  // weight"), "<W>.lora_a" [rank, in] and "<W>.lora_b" [out, rank], B's rows permuted as W's are.
  std::map<std::string, Tensor> by_name(with_adapters.begin(), with_adapters.end());
  const auto rows = in_proj_rows(cfg);
  const int64_t r = cfg.lora.rank, kv_heads = cfg.resolved_kv_heads();
  std::vector<std::pair<std::string, Tensor>> tensors;
  auto add = [&](const std::string& weight, const Tensor& a, const Tensor& b) {
    tensors.emplace_back(weight + ".lora_a", a.contiguous().to(DType::f32));
    tensors.emplace_back(weight + ".lora_b", b.contiguous().to(DType::f32));
  };
  for (const auto& [name, a] : with_adapters) {
    if (!name.ends_with(".lora_A")) continue;
    const std::string owner = name.substr(0, name.size() - 7);
    const Tensor& b = by_name.at(owner + ".lora_B");
    if (!owner.ends_with(".attn")) {
      const std::string w = names.rename(owner + ".weight", Naming::ours, Naming::gguf);
      FSDP_CHECK(!w.empty(), "[gguf] no llama.cpp name for the adapted weight of '{}'", owner);
      add(w, a, b);
      continue;
    }
    const auto qkv = names.in_proj_names(owner + ".in_proj_weight", Naming::gguf);
    const std::array<nn::LoraTarget, 3> parts = {nn::LoraTarget::q, nn::LoraTarget::k,
                                                 nn::LoraTarget::v};
    const std::array<int64_t, 3> heads = {cfg.heads, kv_heads, 0};
    int64_t j = 0, b_row = 0;
    for (size_t i = 0; i < 3; ++i) {
      if (!cfg.lora.on(parts[i])) continue;
      const int64_t n = rows[i].second - rows[i].first;
      Tensor bi = b.narrow(0, b_row, n);
      if (i < 2 && !half_split) bi = permute_for_gguf(bi, heads[i]);
      add(qkv[i], a.narrow(0, j * r, r), bi);
      ++j;
      b_row += n;
    }
  }
  GgufWriter kv;
  kv.kv_str("general.architecture", arch);
  kv.kv_str("general.type", "adapter");
  kv.kv_str("general.name", "fsdp.cpp LoRA adapter");
  kv.kv_u32("general.alignment", kAlign);
  kv.kv_str("adapter.type", "lora");
  kv.kv_f32("adapter.lora.alpha", float(cfg.lora.alpha));
  write_file(path, kv, tensors);
}

}  // namespace fsdp::checkpoint
