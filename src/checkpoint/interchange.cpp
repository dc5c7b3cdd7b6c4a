// Consolidation, Hugging Face names and GGUF v3.
#include "fsdp/checkpoint/interchange.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <type_traits>

#include "fsdp/core/file.h"
#include "src/checkpoint/manifest.h"

namespace fsdp::checkpoint {

using json = nlohmann::json;

namespace {

bool is_in_proj(const std::string& n) {
  return n.find(".attn.in_proj_weight") != std::string::npos;
}
bool is_in_proj_bias(const std::string& n) {
  return n.find(".attn.in_proj_bias") != std::string::npos;
}
std::string layer_prefix(const std::string& n) {
  return n.substr(0, n.find(".attn."));
}  // "layers.3"

}  // namespace

std::array<std::pair<int64_t, int64_t>, 3> in_proj_rows(const nn::MiniLLMConfig& cfg) {
  const int64_t q = cfg.heads * cfg.resolved_head_dim(),
                kv = cfg.resolved_kv_heads() * cfg.resolved_head_dim();
  return {{{0, q}, {q, q + kv}, {q + kv, q + 2 * kv}}};
}

std::string hf_name(const std::string& ours) {
  if (is_in_proj(ours) || is_in_proj_bias(ours)) return "";
  static const std::vector<std::pair<std::string, std::string>> suffix = {
      {".norm1.weight", ".input_layernorm.weight"},
      {".attn.out_proj.weight", ".self_attn.o_proj.weight"},
      {".norm2.weight", ".post_attention_layernorm.weight"},
      {".ffn.w1.weight", ".mlp.gate_proj.weight"},
      {".ffn.w3.weight", ".mlp.up_proj.weight"},
      {".ffn.w2.weight", ".mlp.down_proj.weight"}};
  if (ours == "embed.weight") return "model.embed_tokens.weight";
  if (ours == "norm.weight") return "model.norm.weight";
  if (ours == "head.weight") return "lm_head.weight";
  for (auto& [a, b] : suffix)
    if (ours.size() > a.size() && ours.compare(ours.size() - a.size(), a.size(), a) == 0)
      return "model." + ours.substr(0, ours.size() - a.size()) + b;
  return ours;
}

namespace {
NamedTensors consolidate_unchecked(const std::string& ckpt_path, nn::MiniLLMConfig* cfg_out) {
  // The same checks as a resume's load (detail::read_manifest, detail::open_shard), in the same
  // words, before any tensor byte is read.
  const detail::Manifest m = detail::read_manifest(ckpt_path);
  nn::MiniLLMConfig cfg = nn::MiniLLMConfig::from_json(m.meta.at("config").dump());
  if (cfg_out) *cfg_out = cfg;
  std::vector<std::unique_ptr<SafetensorsIndex>> files;
  for (int s = 0; s < m.shards; ++s) files.push_back(detail::open_shard(m, s));
  nn::MiniLLM model(cfg);
  NamedTensors out;
  for (auto& [name, p] : model.named_parameters()) {
    const auto it = m.tensors.find(name);
    FSDP_CHECK(it != m.tensors.end(), "[checkpoint] {} has no tensor '{}'", ckpt_path, name);
    const detail::TensorEntry& t = it->second;
    FSDP_CHECK(t.shape == p->shape, "[checkpoint] {}: '{}' has shape {} but the model has {}",
               ckpt_path, name, shape_str(t.shape), shape_str(p->shape));
    Tensor full = Tensor::empty(p->shape, t.dtype);
    const int64_t row = p->shape[0] ? shape_numel(p->shape) / p->shape[0] : 0;
    Tensor flat = full.view({-1});
    for (int s = 0; s < m.shards; ++s) {
      const auto [b, len] = t.chunks[size_t(s)];
      if (len > 0)
        flat.slice(b * row, (b + len) * row)
            .copy_(files[size_t(s)]->read("param/" + name).reshape({-1}));
    }
    out.emplace_back(name, full);
  }
  return out;
}
}  // namespace

NamedTensors consolidate(const std::string& ckpt_path, nn::MiniLLMConfig* cfg_out) {
  try {
    return consolidate_unchecked(ckpt_path, cfg_out);
  } catch (const json::exception& e) {  // valid JSON of the wrong shape: name the file
    FSDP_FAIL("[checkpoint] {}/metadata.json does not hold a checkpoint's fields: {}", ckpt_path,
              e.what());
  }
}

NamedTensors to_hf_llama(const nn::MiniLLMConfig& cfg, const NamedTensors& ours) {
  FSDP_CHECK(cfg.arch == nn::Arch::llama,
             "[export] Hugging Face names are for the llama architecture, not {}",
             nn::arch_name(cfg.arch));
  NamedTensors out;
  const auto rows = in_proj_rows(cfg);
  for (auto& [name, t] : ours) {
    if (is_in_proj(name) || is_in_proj_bias(name)) {
      const std::string base = "model." + layer_prefix(name) + ".self_attn.";
      const char* kind = is_in_proj(name) ? ".weight" : ".bias";
      const char* parts[3] = {"q_proj", "k_proj", "v_proj"};
      for (int i = 0; i < 3; ++i)
        out.emplace_back(base + parts[i] + kind, t.slice(rows[i].first, rows[i].second));
    } else {
      out.emplace_back(hf_name(name), t);
    }
  }
  return out;
}

std::string TokenizerMeta::to_json() const {
  json j = {{"chat_template", chat_template}, {"pre", pre}};
  j["bos_token_id"] = bos ? json(*bos) : json(nullptr);
  j["eos_token_id"] = eos ? json(*eos) : json(nullptr);
  return j.dump(2);
}

TokenizerMeta TokenizerMeta::from_json(const std::string& text, const std::string& where) {
  try {
    const json j = json::parse(text);
    TokenizerMeta m;
    m.chat_template = j.value("chat_template", "");
    m.pre = j.value("pre", "");
    if (j.contains("bos_token_id") && !j["bos_token_id"].is_null())
      m.bos = j["bos_token_id"].get<int32_t>();
    if (j.contains("eos_token_id") && !j["eos_token_id"].is_null())
      m.eos = j["eos_token_id"].get<int32_t>();
    return m;
  } catch (const json::exception& e) {
    FSDP_FAIL("[checkpoint] {} is not a tokenizer_meta.json: {}", where, e.what());
  }
}

std::string hf_llama_config_json(const nn::MiniLLMConfig& cfg, DType dtype,
                                 const data::Tokenizer& tok, const TokenizerMeta& meta) {
  // q/k/v biases without an o_proj bias are Qwen2's attention (Llama's attention_bias puts one on
  // o_proj too); the rest of Qwen2ForCausalLM is Llama's.
  const bool qwen2 = cfg.qkv_bias;
  json j = {{"architectures", {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
            {"model_type", qwen2 ? "qwen2" : "llama"},
            {"hidden_size", cfg.dim},
            {"intermediate_size", cfg.resolved_ffn_hidden()},
            {"num_attention_heads", cfg.heads},
            {"num_key_value_heads", cfg.resolved_kv_heads()},
            {"head_dim", cfg.resolved_head_dim()},
            {"num_hidden_layers", cfg.layers},
            {"vocab_size", cfg.vocab},
            {"max_position_embeddings", cfg.seq},
            {"rms_norm_eps", cfg.norm_eps.value_or(1.1920928955078125e-07)},
            {"rope_theta", cfg.rope_theta},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", cfg.tie_embeddings},
            {"attention_bias", false},
            {"torch_dtype", dtype == DType::bf16  ? "bfloat16"
                            : dtype == DType::f16 ? "float16"
                                                  : "float32"}};
  if (qwen2) {
    j.erase("attention_bias");
    j["use_sliding_window"] = false;
  }
  if (auto bos = meta.bos ? meta.bos : tok.bos_id()) j["bos_token_id"] = *bos;
  if (auto eos = meta.eos ? meta.eos : tok.eos_id()) j["eos_token_id"] = *eos;
  return j.dump(2);
}

nn::MiniLLMConfig config_from_hf_llama(const std::string& text, const std::string& where,
                                       bool* tied) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    FSDP_FAIL("[hf] {} is not valid JSON: {}", where, e.what());
  }
  const std::string model_type = j.value("model_type", "");
  FSDP_CHECK(model_type == "llama" || model_type == "qwen2",
             "[hf] {}: model_type '{}' is not supported; expected llama (LlamaForCausalLM) or "
             "qwen2 (Qwen2ForCausalLM)",
             where, model_type);
  auto num = [&](const char* key) -> int64_t {
    FSDP_CHECK(j.contains(key) && j[key].is_number_integer(), "[hf] {}: no integer '{}'", where,
               key);
    return j[key].get<int64_t>();
  };
  nn::MiniLLMConfig c;
  c.arch = nn::Arch::llama;
  c.dim = num("hidden_size");
  c.ffn_hidden = num("intermediate_size");
  c.heads = num("num_attention_heads");
  c.layers = num("num_hidden_layers");
  c.vocab = num("vocab_size");
  c.seq = j.value("max_position_embeddings", c.seq);
  c.norm_eps = j.value("rms_norm_eps", 1e-6);
  c.rope_theta = j.value("rope_theta", 10000.0);
  const bool qwen2 = model_type == "qwen2";
  c.kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                   ? num("num_key_value_heads")
                   : c.heads;
  FSDP_CHECK(c.kv_heads > 0 && c.heads % c.kv_heads == 0,
             "[hf] {}: num_attention_heads {} is not a multiple of num_key_value_heads {}", where,
             c.heads, c.kv_heads);
  if (j.contains("head_dim") && !j["head_dim"].is_null()) c.head_dim = num("head_dim");
  // Llama's attention_bias is on q, k, v and o; Qwen2's biases are on q, k and v only.
  FSDP_CHECK(!j.value("attention_bias", false),
             "[hf] {}: attention_bias true (a bias on o_proj too) is not supported", where);
  FSDP_CHECK(!j.value("mlp_bias", false), "[hf] {}: mlp_bias true is not supported", where);
  FSDP_CHECK(!qwen2 || !j.value("use_sliding_window", false),
             "[hf] {}: use_sliding_window true (sliding-window attention) is not supported", where);
  c.qkv_bias = qwen2;
  FSDP_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(),
             "[hf] {}: rope_scaling {} is not supported", where, j["rope_scaling"].dump());
  FSDP_CHECK(j.value("hidden_act", "silu") == "silu",
             "[hf] {}: hidden_act '{}' is not supported; expected silu", where,
             j.value("hidden_act", ""));
  // transformers' default for both classes: untied.
  c.tie_embeddings = j.value("tie_word_embeddings", false);
  if (tied) *tied = c.tie_embeddings;
  c.validate();
  return c;
}

std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const nn::MiniLLMConfig& cfg,
                                                                    const data::Tokenizer& tok,
                                                                    const TokenizerMeta& meta) {
  auto token = [&](std::optional<int32_t> id) -> json {
    return id ? json(tok.tokens()[size_t(*id)]) : json(nullptr);
  };
  const std::optional<int32_t> bos = meta.bos ? meta.bos : tok.bos_id(),
                               eos = meta.eos ? meta.eos : tok.eos_id();
  json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"bos_token", token(bos)},
                 {"eos_token", token(eos)},
                 {"add_bos_token", false},
                 {"add_eos_token", false},
                 {"clean_up_tokenization_spaces", false},
                 {"model_max_length", cfg.seq}};
  if (!meta.chat_template.empty()) config["chat_template"] = meta.chat_template;
  json gen = {{"_from_model_config", true}};
  if (bos) gen["bos_token_id"] = *bos;
  if (eos) gen["eos_token_id"] = *eos;
  return {{"tokenizer.json", tok.json()},
          {"tokenizer_config.json", config.dump(2)},
          {"generation_config.json", gen.dump(2)}};
}

// ---------------------------------------------------------------- GGUF

namespace {

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

}  // namespace

void write_gguf(const std::string& path, const nn::MiniLLMConfig& cfg, const NamedTensors& ours,
                DType dtype, const data::Tokenizer& tok, const TokenizerMeta& meta) {
  FSDP_CHECK(cfg.arch == nn::Arch::llama,
             "[gguf] GGUF export is for the llama architecture, not {}", nn::arch_name(cfg.arch));
  constexpr size_t kAlign = 32;
  // q/k/v biases are llama.cpp's qwen2 architecture, whose rotary embedding is half-split
  // (NEOX) like ours: its q and k rows stay as they are. llama's pairs neighbours.
  const bool qwen2 = cfg.qkv_bias;
  const std::string arch = qwen2 ? "qwen2" : "llama";
  // Tensors in llama.cpp's names; 1-D norms (and biases) stay F32 as llama.cpp's converter keeps
  // them. A tied model has no output.weight: llama.cpp then uses token_embd.weight.
  std::vector<std::pair<std::string, Tensor>> tensors;
  const auto rows = in_proj_rows(cfg);
  const int64_t kv_heads = cfg.resolved_kv_heads();
  auto qk = [&](const Tensor& t, int64_t heads) { return qwen2 ? t : permute_for_gguf(t, heads); };
  for (auto& [name, t] : ours) {
    const bool is_vec = t.dim() == 1;
    auto add = [&](const std::string& n, const Tensor& x) {
      tensors.emplace_back(n, x.contiguous().to(is_vec ? DType::f32 : dtype));
    };
    if (name == "embed.weight")
      add("token_embd.weight", t);
    else if (name == "norm.weight")
      add("output_norm.weight", t);
    else if (name == "head.weight")
      add("output.weight", t);
    else {
      const std::string blk = "blk." + name.substr(7, name.find('.', 7) - 7) + ".";  // "layers.N."
      if (is_in_proj(name) || is_in_proj_bias(name)) {
        const std::string kind = is_in_proj(name) ? ".weight" : ".bias";
        add(blk + "attn_q" + kind, qk(t.slice(rows[0].first, rows[0].second), cfg.heads));
        add(blk + "attn_k" + kind, qk(t.slice(rows[1].first, rows[1].second), kv_heads));
        add(blk + "attn_v" + kind, t.slice(rows[2].first, rows[2].second));
      } else if (name.ends_with(".norm1.weight"))
        add(blk + "attn_norm.weight", t);
      else if (name.ends_with(".attn.out_proj.weight"))
        add(blk + "attn_output.weight", t);
      else if (name.ends_with(".norm2.weight"))
        add(blk + "ffn_norm.weight", t);
      else if (name.ends_with(".ffn.w1.weight"))
        add(blk + "ffn_gate.weight", t);
      else if (name.ends_with(".ffn.w3.weight"))
        add(blk + "ffn_up.weight", t);
      else if (name.ends_with(".ffn.w2.weight"))
        add(blk + "ffn_down.weight", t);
      else
        FSDP_FAIL("[gguf] no llama.cpp name for parameter '{}'", name);
    }
  }
  GgufWriter kv;
  kv.kv_str("general.architecture", arch);
  kv.kv_str("general.name", "fsdp.cpp MiniLLM");
  kv.kv_u32("general.alignment", kAlign);
  kv.kv_u32("general.file_type", dtype == DType::f32 ? 0 : dtype == DType::f16 ? 1 : 32);
  const std::string a = arch + ".";
  kv.kv_u32(a + "vocab_size", uint32_t(cfg.vocab));
  kv.kv_u32(a + "context_length", uint32_t(cfg.seq));
  kv.kv_u32(a + "embedding_length", uint32_t(cfg.dim));
  kv.kv_u32(a + "block_count", uint32_t(cfg.layers));
  kv.kv_u32(a + "feed_forward_length", uint32_t(cfg.resolved_ffn_hidden()));
  kv.kv_u32(a + "rope.dimension_count", uint32_t(cfg.resolved_head_dim()));
  kv.kv_u32(a + "attention.head_count", uint32_t(cfg.heads));
  kv.kv_u32(a + "attention.head_count_kv", uint32_t(kv_heads));
  kv.kv_u32(a + "attention.key_length", uint32_t(cfg.resolved_head_dim()));
  kv.kv_u32(a + "attention.value_length", uint32_t(cfg.resolved_head_dim()));
  kv.kv_f32(a + "attention.layer_norm_rms_epsilon",
            float(cfg.norm_eps.value_or(1.1920928955078125e-07)));
  kv.kv_f32(a + "rope.freq_base", float(cfg.rope_theta));
  // The tokenizer, as llama.cpp's "gpt2" (byte-level BPE) model with GPT-2's split.
  FSDP_CHECK(tok.size() <= cfg.vocab, "[gguf] the tokenizer has {} ids but the model only {}",
             tok.size(), cfg.vocab);
  enum TokenType : int32_t { NORMAL = 1, CONTROL = 3, UNUSED = 5 };
  std::vector<std::string> tokens(tok.tokens());
  std::vector<int32_t> types;
  for (int32_t i = 0; i < int32_t(tok.size()); ++i)
    types.push_back(tok.is_special(i) ? CONTROL : NORMAL);
  std::optional<int32_t> bos = meta.bos ? meta.bos : tok.bos_id(),
                         eos = meta.eos ? meta.eos : tok.eos_id();
  for (int64_t i = tok.size(); i < cfg.vocab; ++i) {
    tokens.push_back(fmt::format("<unused{}>", i));
    types.push_back(UNUSED);
  }
  if (!bos && !eos && cfg.vocab >= tok.size() + 2) {  // ids the model never saw: never produced
    bos = int32_t(tok.size());
    eos = int32_t(tok.size() + 1);
    tokens[size_t(*bos)] = "<|bos|>";
    tokens[size_t(*eos)] = "<|endoftext|>";
    types[size_t(*bos)] = types[size_t(*eos)] = CONTROL;
  }
  std::vector<std::string> merges = tok.merges();
  if (merges.empty()) merges.push_back("a 1");
  kv.kv_str("tokenizer.ggml.model", "gpt2");
  kv.kv_str("tokenizer.ggml.pre", meta.pre.empty() ? "gpt-2" : meta.pre);
  kv.kv_strs("tokenizer.ggml.tokens", tokens);
  kv.kv_i32s("tokenizer.ggml.token_type", types);
  kv.kv_strs("tokenizer.ggml.merges", merges);
  if (bos) kv.kv_u32("tokenizer.ggml.bos_token_id", uint32_t(*bos));
  if (eos) kv.kv_u32("tokenizer.ggml.eos_token_id", uint32_t(*eos));
  kv.kv_bool("tokenizer.ggml.add_bos_token", false);
  kv.kv_bool("tokenizer.ggml.add_eos_token", false);
  if (!meta.chat_template.empty()) kv.kv_str("tokenizer.chat_template", meta.chat_template);

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

}  // namespace fsdp::checkpoint
