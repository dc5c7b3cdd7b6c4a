// Consolidation, Hugging Face names and GGUF v3.
#include "fsdp/checkpoint/interchange.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>

namespace fsdp::checkpoint {

using json = nlohmann::json;

namespace {

bool is_in_proj(const std::string& n) {
  return n.find(".attn.in_proj_weight") != std::string::npos;
}
std::string layer_prefix(const std::string& n) {
  return n.substr(0, n.find(".attn."));
}  // "layers.3"

}  // namespace

std::string hf_name(const std::string& ours) {
  if (is_in_proj(ours)) return "";
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

NamedTensors consolidate(const std::string& ckpt_path, nn::MiniLLMConfig* cfg_out) {
  namespace fs = std::filesystem;
  const fs::path dir(ckpt_path);
  json meta;
  {
    std::ifstream f(dir / "metadata.json");
    FSDP_CHECK(f.good(), "[export] {} has no metadata.json (not a checkpoint)", ckpt_path);
    f >> meta;
  }
  nn::MiniLLMConfig cfg = nn::MiniLLMConfig::from_json(meta.at("config").dump());
  if (cfg_out) *cfg_out = cfg;
  const int shards = meta.at("shards").get<int>();
  std::vector<std::unique_ptr<SafetensorsIndex>> files;
  for (int s = 0; s < shards; ++s) {
    const std::string name = fmt::format("shard_{:05d}.safetensors", s);
    const std::string path = (dir / name).string();
    FSDP_CHECK(fs::exists(path), "[export] {} is missing {}", ckpt_path, name);
    const std::string expect = meta["files"].value(name, json::object()).value("checksum", "");
    FSDP_CHECK(file_checksum(path) == expect,
               "[export] {}: checksum does not match the metadata (corrupted)", path);
    files.push_back(std::make_unique<SafetensorsIndex>(path));
  }
  nn::MiniLLM model(cfg);
  NamedTensors out;
  for (auto& [name, p] : model.named_parameters()) {
    const json& t = meta.at("tensors").at(name);
    Tensor full = Tensor::empty(p->shape, parse_dtype(t.at("dtype").get<std::string>()));
    const int64_t row = shape_numel(p->shape) / p->shape[0];
    Tensor flat = full.view({-1});
    for (int s = 0; s < shards; ++s) {
      const int64_t b = t["chunks"][s][0], len = t["chunks"][s][1];
      if (len > 0)
        flat.slice(b * row, (b + len) * row)
            .copy_(files[size_t(s)]->read("param/" + name).reshape({-1}));
    }
    out.emplace_back(name, full);
  }
  return out;
}

NamedTensors to_hf_llama(const nn::MiniLLMConfig& cfg, const NamedTensors& ours) {
  FSDP_CHECK(cfg.arch == nn::Arch::llama,
             "[export] Hugging Face names are for the llama architecture, not {}",
             nn::arch_name(cfg.arch));
  NamedTensors out;
  const int64_t d = cfg.dim;
  for (auto& [name, t] : ours) {
    if (is_in_proj(name)) {
      const std::string base = "model." + layer_prefix(name) + ".self_attn.";
      out.emplace_back(base + "q_proj.weight", t.slice(0, d));
      out.emplace_back(base + "k_proj.weight", t.slice(d, 2 * d));
      out.emplace_back(base + "v_proj.weight", t.slice(2 * d, 3 * d));
    } else {
      out.emplace_back(hf_name(name), t);
    }
  }
  return out;
}

std::string hf_llama_config_json(const nn::MiniLLMConfig& cfg, DType dtype) {
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"hidden_size", cfg.dim},
            {"intermediate_size", cfg.resolved_ffn_hidden()},
            {"num_attention_heads", cfg.heads},
            {"num_key_value_heads", cfg.heads},
            {"num_hidden_layers", cfg.layers},
            {"vocab_size", cfg.vocab},
            {"max_position_embeddings", cfg.seq},
            {"rms_norm_eps", cfg.norm_eps.value_or(1.1920928955078125e-07)},
            {"rope_theta", cfg.rope_theta},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},
            {"attention_bias", false},
            {"torch_dtype", dtype == DType::bf16  ? "bfloat16"
                            : dtype == DType::f16 ? "float16"
                                                  : "float32"}};
  return j.dump(2);
}

Tensor read_param(const SafetensorsIndex& file, const nn::MiniLLMConfig& cfg,
                  const std::string& name) {
  if (file.contains(name)) return file.read(name);
  FSDP_CHECK(cfg.arch == nn::Arch::llama, "[init-from] {}: no tensor named '{}'", file.path(),
             name);
  if (is_in_proj(name)) {
    const std::string base = "model." + layer_prefix(name) + ".self_attn.";
    const int64_t d = cfg.dim;
    Tensor full = Tensor::empty({3 * d, d}, DType::f32);
    const char* parts[3] = {"q_proj.weight", "k_proj.weight", "v_proj.weight"};
    for (int i = 0; i < 3; ++i) {
      FSDP_CHECK(file.contains(base + parts[i]), "[init-from] {}: no tensor '{}' nor '{}'",
                 file.path(), name, base + parts[i]);
      full.slice(i * d, (i + 1) * d).copy_(file.read(base + parts[i]));
    }
    return full;
  }
  const std::string hf = hf_name(name);
  FSDP_CHECK(file.contains(hf), "[init-from] {}: no tensor '{}' nor '{}'", file.path(), name, hf);
  return file.read(hf);
}

// ---------------------------------------------------------------- GGUF

namespace {

enum GgufType : uint32_t { U32 = 4, I32 = 5, F32 = 6, STR = 8, ARR = 9 };

class GgufWriter {
 public:
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void f32(float v) { raw(&v, 4); }
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void kv_u32(const std::string& k, uint32_t v) { str(k), u32(U32), u32(v); }
  void kv_f32(const std::string& k, float v) { str(k), u32(F32), f32(v); }
  void kv_str(const std::string& k, const std::string& v) { str(k), u32(STR), str(v); }
  void raw(const void* p, size_t n) {
    buf.insert(buf.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
  }
  void pad(size_t align) { buf.resize((buf.size() + align - 1) / align * align, 0); }
  std::vector<char> buf;
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

// Hugging Face's half-split q/k rows -> llama.cpp's neighbouring pairs, per head.
Tensor permute_for_gguf(const Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0), cols = w.size(1), hd = rows / heads;
  return w.contiguous()
      .view({heads, 2, hd / 2, cols})
      .transpose(1, 2)
      .contiguous()
      .view({rows, cols});
}

}  // namespace

void write_gguf(const std::string& path, const nn::MiniLLMConfig& cfg, const NamedTensors& ours,
                DType dtype) {
  FSDP_CHECK(cfg.arch == nn::Arch::llama,
             "[gguf] GGUF export is for the llama architecture, not {}", nn::arch_name(cfg.arch));
  constexpr size_t kAlign = 32;
  // Tensors in llama.cpp's names; 1-D norms stay F32 as llama.cpp's converter keeps them.
  std::vector<std::pair<std::string, Tensor>> tensors;
  const int64_t d = cfg.dim;
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
      if (is_in_proj(name)) {
        add(blk + "attn_q.weight", permute_for_gguf(t.slice(0, d), cfg.heads));
        add(blk + "attn_k.weight", permute_for_gguf(t.slice(d, 2 * d), cfg.heads));
        add(blk + "attn_v.weight", t.slice(2 * d, 3 * d));
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
  GgufWriter w;
  w.raw("GGUF", 4);
  w.u32(3);
  w.u64(tensors.size());
  const uint64_t n_kv = 19;
  w.u64(n_kv);
  w.kv_str("general.architecture", "llama");
  w.kv_str("general.name", "fsdp.cpp MiniLLM");
  w.kv_u32("general.alignment", kAlign);
  w.kv_u32("general.file_type", dtype == DType::f32 ? 0 : dtype == DType::f16 ? 1 : 32);
  w.kv_u32("llama.vocab_size", uint32_t(cfg.vocab));
  w.kv_u32("llama.context_length", uint32_t(cfg.seq));
  w.kv_u32("llama.embedding_length", uint32_t(cfg.dim));
  w.kv_u32("llama.block_count", uint32_t(cfg.layers));
  w.kv_u32("llama.feed_forward_length", uint32_t(cfg.resolved_ffn_hidden()));
  w.kv_u32("llama.rope.dimension_count", uint32_t(cfg.dim / cfg.heads));
  w.kv_u32("llama.attention.head_count", uint32_t(cfg.heads));
  w.kv_u32("llama.attention.head_count_kv", uint32_t(cfg.heads));
  w.kv_f32("llama.attention.layer_norm_rms_epsilon",
           float(cfg.norm_eps.value_or(1.1920928955078125e-07)));
  w.kv_f32("llama.rope.freq_base", float(cfg.rope_theta));
  w.kv_str("tokenizer.ggml.model", "llama");
  // Byte-level vocab: token i < 256 is the byte i ("<0xNN>", type BYTE); the rest are unused.
  w.str("tokenizer.ggml.tokens");
  w.u32(ARR);
  w.u32(STR);
  w.u64(uint64_t(cfg.vocab));
  for (int64_t i = 0; i < cfg.vocab; ++i)
    w.str(i < 256 ? fmt::format("<0x{:02X}>", i) : fmt::format("<unused{}>", i));
  w.str("tokenizer.ggml.scores");
  w.u32(ARR);
  w.u32(F32);
  w.u64(uint64_t(cfg.vocab));
  for (int64_t i = 0; i < cfg.vocab; ++i) w.f32(0.f);
  w.str("tokenizer.ggml.token_type");
  w.u32(ARR);
  w.u32(I32);
  w.u64(uint64_t(cfg.vocab));
  for (int64_t i = 0; i < cfg.vocab; ++i) {
    const int32_t type = i < 256 ? 6 : 5;  // BYTE : UNUSED
    w.raw(&type, 4);
  }
  w.kv_u32("tokenizer.ggml.bos_token_id",
           2);  // STX and ETX mark text start and end in a byte vocab
  // (n_kv counts the entries above: 15 scalars + 3 arrays + bos = 19)
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
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(w.buf.data(), std::streamsize(w.buf.size()));
    FSDP_CHECK(f.good(), "[gguf] writing '{}' failed", tmp);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace fsdp::checkpoint
