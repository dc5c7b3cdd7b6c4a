// load_pretrained: one loader for Hugging Face folders, safetensors files and GGUF files
// (fsdp/checkpoint/pretrained.h). Files are mapped; a parameter's rows are read only when asked
// for, so a sharded rank touches only the bytes of its own rows.
#include "fsdp/checkpoint/pretrained.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/models/spec.h"
#include "src/checkpoint/param_names.h"
#include "src/core/json_fields.h"
#include "src/core/json_read.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct PretrainedSource {
  std::string path;
  std::optional<GgufFile> gguf;
  std::vector<SafetensorsFile> files;  // mapped
  std::map<std::string, const Tensor*> by_name;

  const Tensor* find(const std::string& name) const {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  }
};

namespace {

std::string read_text(const fs::path& p) {
  check_regular(p.string(), "[pretrained]");
  std::ifstream f(p, std::ios::binary);
  FSDP_CHECK(f.good(), "[pretrained] cannot read '{}'", p.string());
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

using detail::is_in_proj;
using detail::is_in_proj_bias;

// Our parameter name -> llama.cpp's tensor name ("" for the packed in-projection and for a block
// parameter llama.cpp does not name; a name outside the table stays as it is).
std::string gguf_name(const std::string& ours, bool sandwich) {
  const std::string g = detail::rename(ours, detail::Naming::ours, detail::Naming::gguf, sandwich);
  return !g.empty() || ours.starts_with("layers.") ? g : ours;
}

// The id of token `text`, if the vocabulary has it.
std::optional<int32_t> token_id(const data::Tokenizer& tok, const std::string& text) {
  const auto& tokens = tok.tokens();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == text) return int32_t(i);
  return std::nullopt;
}

// tokenizer_config.json's bos_token / eos_token: a string or {"content": ...}.
std::optional<std::string> token_field(const json& j, const char* key, const std::string& where) {
  const json* v = json_fields::member(j, key);
  if (!v) return std::nullopt;
  const json_fields::Field f{"[pretrained]", where, key};
  if (v->is_string()) return v->get<std::string>();
  if (!v->is_object()) f.wrong("a string or an object with a \"content\" string", *v);
  const json* content = json_fields::member(*v, "content");
  if (!content) f.wrong("a string or an object with a \"content\" string", *v);
  return f.at("content").string(*content);
}

// End of turn: ChatML's <|im_end|> when the template uses it, else EOS.
void set_eot(Pretrained& p) {
  p.eot_id = p.tokenizer ? end_of_turn_id(*p.tokenizer, p.chat_template, p.eos_id) : p.eos_id;
}

// A GgufFile as the header a family reads its config from.
class GgufHeaderOf final : public models::GgufHeader {
 public:
  explicit GgufHeaderOf(const GgufFile& f) : f_(f) {}
  const std::string& path() const override { return f_.path(); }
  bool has(const std::string& key) const override { return f_.has(key); }
  int64_t get_int(const std::string& key) const override { return f_.get_int(key); }
  int64_t get_int(const std::string& key, int64_t fallback) const override {
    return f_.get_int(key, fallback);
  }
  double get_float(const std::string& key, double fallback) const override {
    return f_.get_float(key, fallback);
  }
  std::string get_string(const std::string& key, const std::string& fallback) const override {
    return f_.get_string(key, fallback);
  }
  int64_t array_size(const std::string& key) const override {
    return int64_t(f_.get_strings(key).size());
  }
  bool contains(const std::string& tensor) const override { return f_.contains(tensor); }
  std::vector<int64_t> tensor_ne(const std::string& tensor) const override {
    return f_.tensor(tensor).ne;
  }
  std::vector<double> read_f64(const std::string& tensor) const override {
    return f_.read(tensor, RowOrder::file, DType::f64).to_f64_vector();
  }

 private:
  const GgufFile& f_;
};

}  // namespace

nn::TransformerConfig config_from_gguf(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture", "");
  const models::ModelSpec* spec = models::spec_for_gguf_arch(arch);
  std::string known;
  for (const models::ModelSpec* s : models::model_specs())
    if (s->read_gguf_config) known += (known.empty() ? "" : ", ") + std::string(s->gguf_arch);
  FSDP_CHECK(
      spec && spec->read_gguf_config,
      "[gguf] {}: general.architecture '{}' is not read{}; fsdp.cpp reads {}", f.path(), arch,
      spec ? fmt::format(" (the {} family's GGUF files are not read yet)", spec->name) : "", known);
  return spec->read_gguf_config(GgufHeaderOf(f));
}

namespace {

void open_gguf(Pretrained& p, PretrainedSource& src) {
  src.gguf.emplace(p.path);
  const GgufFile& f = *src.gguf;
  p.format = "gguf";
  p.family = f.get_string("general.architecture", "");
  p.config = config_from_gguf(f);
  if (const std::string model = f.get_string("tokenizer.ggml.model", "");
      !model.empty() && model != "gpt2" && model != "llama") {
    p.tokenizer_unread = fmt::format(
        "{}: its tokenizer (tokenizer.ggml.model '{}') is not read: fsdp.cpp reads \"gpt2\" and "
        "\"llama\"",
        p.path, model);
    p.bos_id = f.has("tokenizer.ggml.bos_token_id")
                   ? std::optional<int32_t>(int32_t(f.get_int("tokenizer.ggml.bos_token_id")))
                   : std::nullopt;
    p.eos_id = f.has("tokenizer.ggml.eos_token_id")
                   ? std::optional<int32_t>(int32_t(f.get_int("tokenizer.ggml.eos_token_id")))
                   : std::nullopt;
    p.eot_id = p.eos_id;
  } else if (f.has("tokenizer.ggml.model")) {
    const GgufTokenizerInfo info = gguf_tokenizer_info(f);
    p.tokenizer = gguf_tokenizer(f);
    p.tokenizer_pre = info.pre;
    p.chat_template = info.chat_template;
    p.bos_id = info.bos;
    p.eos_id = info.eos;
    set_eot(p);
    if (f.has("tokenizer.ggml.eot_token_id"))
      p.eot_id = int32_t(f.get_int("tokenizer.ggml.eot_token_id"));
  }
}

// The tokenizer files of a Hugging Face folder: tokenizer.json, tokenizer_config.json's chat
// template and special tokens, generation_config.json's ids.
void read_hf_tokenizer(Pretrained& p, const fs::path& dir) {
  if (!fs::exists(dir / "tokenizer.json")) return;
  p.tokenizer = data::Tokenizer::from_file((dir / "tokenizer.json").string());
  p.bos_id = p.tokenizer->bos_id();
  p.eos_id = p.tokenizer->eos_id();
  // Hugging Face's Sequence [Digits(individual_digits), ByteLevel] is llama.cpp's "smollm" split,
  // Llama 3's and Qwen2's Split regexes its "llama-bpe" and "qwen2".
  try {
    const json tj = json::parse(p.tokenizer->json());
    p.tokenizer_pre = "gpt-2";
    const json& pre = tj.value("pre_tokenizer", json());
    if (pre.is_object() && pre.value("type", "") == "Sequence")
      for (const json& s : pre.value("pretokenizers", json::array())) {
        if (s.value("type", "") == "Digits") p.tokenizer_pre = "smollm";
        // llama.cpp's names for Llama 3's and Qwen2's split regexes
        const std::string regex = s.contains("pattern") && s["pattern"].is_object()
                                      ? s["pattern"].value("Regex", "")
                                      : "";
        if (regex == data::kLlama3Split) p.tokenizer_pre = "llama-bpe";
        if (regex == data::kQwen2Split) p.tokenizer_pre = "qwen2";
      }
  } catch (const json::exception&) {
  }
  if (fs::exists(dir / "tokenizer_config.json")) {
    const std::string where = (dir / "tokenizer_config.json").string();
    const json tc = json_read::parse(read_text(dir / "tokenizer_config.json"), where,
                                     "[pretrained]", json_read::kSmallMaxBytes);
    FSDP_CHECK(tc.is_object(), "[pretrained] {}: expected a JSON object, got {}", where,
               json_fields::described(tc));
    if (const json* t = json_fields::member(tc, "chat_template")) {
      const json_fields::Field f{"[pretrained]", where, "chat_template"};
      if (t->is_string()) {
        p.chat_template = t->get<std::string>();
      } else if (t->is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (size_t i = 0; i < t->size(); ++i) {
          const json& e = f.at(i).object((*t)[i]);
          const json* name = json_fields::member(e, "name");
          const json* text = json_fields::member(e, "template");
          if (name && f.at(i).at("name").string(*name) == "default" && text)
            p.chat_template = f.at(i).at("template").string(*text);
        }
      } else {
        f.wrong("a string or an array of {\"name\", \"template\"}", *t);
      }
    }
    if (auto b = token_field(tc, "bos_token", where)) p.bos_id = token_id(*p.tokenizer, *b);
    if (auto e = token_field(tc, "eos_token", where)) p.eos_id = token_id(*p.tokenizer, *e);
  }
  // transformers 5 saves the template beside tokenizer_config.json, as chat_template.jinja (and
  // reads it before tokenizer_config.json's).
  if (fs::exists(dir / "chat_template.jinja"))
    p.chat_template = read_text(dir / "chat_template.jinja");
  if (fs::exists(dir / "generation_config.json")) {
    const std::string where = (dir / "generation_config.json").string();
    const json g = json_read::parse(read_text(dir / "generation_config.json"), where,
                                    "[pretrained]", json_read::kSmallMaxBytes);
    FSDP_CHECK(g.is_object(), "[pretrained] {}: expected a JSON object, got {}", where,
               json_fields::described(g));
    if (const json* b = json_fields::member(g, "bos_token_id"))
      p.bos_id = json_fields::Field{"[pretrained]", where, "bos_token_id"}.id(*b);
    if (const json* e = json_fields::member(g, "eos_token_id")) {
      const json_fields::Field f{"[pretrained]", where, "eos_token_id"};
      if (e->is_array()) {  // the first is the one that ends a turn
        for (size_t i = 0; i < e->size(); ++i) f.at(i).id((*e)[i]);
        if (!e->empty()) p.eos_id = f.at(0).id((*e)[0]);
      } else {
        p.eos_id = f.id(*e);
      }
    }
  }
  set_eot(p);
}

// The files a model folder names are read only inside its tree (core/file.h's
// check_inside_folder): a chat_template.jinja linked to a secret elsewhere is refused by name
// before a byte of it is read. The file the user names (a .safetensors) is theirs to place.
void check_folder_files(const fs::path& dir) {
  for (const char* name :
       {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
        "chat_template.jinja", "model.safetensors", "model.safetensors.index.json"})
    check_inside_folder(dir.string(), (dir / name).string(), "[pretrained]");
}

void open_safetensors(Pretrained& p, PretrainedSource& src) {
  const bool is_dir = fs::is_directory(p.path);
  const fs::path dir = is_dir ? fs::path(p.path) : fs::path(p.path).parent_path();
  check_folder_files(dir);
  std::vector<std::string> paths;
  if (is_dir) {
    if (fs::exists(dir / "model.safetensors.index.json")) {
      const std::string where = (dir / "model.safetensors.index.json").string();
      try {
        const json index =
            json_read::parse(read_text(where), where, "[pretrained]", json_read::kSmallMaxBytes);
        for (auto& [name, file] : index.at("weight_map").items()) {
          const std::string f = (dir / file.get<std::string>()).string();
          if (std::find(paths.begin(), paths.end(), f) == paths.end()) paths.push_back(f);
        }
      } catch (const json::exception& e) {
        FSDP_FAIL("[pretrained] {} is not a safetensors index (weight_map): {}", where, e.what());
      }
      FSDP_CHECK(!paths.empty(),
                 "[pretrained] {}: weight_map names no tensors; the folder holds no weights",
                 where);
    } else {
      FSDP_CHECK(fs::exists(dir / "model.safetensors"),
                 "[pretrained] {} holds neither model.safetensors nor "
                 "model.safetensors.index.json (nor is it a .gguf file)",
                 p.path);
      paths.push_back((dir / "model.safetensors").string());
    }
  } else {
    paths.push_back(p.path);
  }
  for (const std::string& f : paths) {
    if (is_dir) check_inside_folder(dir.string(), f, "[pretrained] the weight_map's file");
    src.files.push_back(map_safetensors(f));
  }
  for (const auto& f : src.files)
    for (const auto& [n, t] : f.tensors) src.by_name.emplace(n, &t);
  const auto& meta = src.files[0].metadata;
  if (meta.count("fsdp.config")) {
    p.format = "safetensors";
    p.family = "minillm";
    p.config = config_from_family("minillm", meta.at("fsdp.config"), p.path);
  } else if (fs::exists(dir / "config.json")) {
    const std::string where = (dir / "config.json").string();
    const std::string text = read_text(dir / "config.json");
    const json j = json_read::parse(text, where, "[pretrained]", json_read::kSmallMaxBytes);
    p.format = "hf";
    const json* mt = json_fields::member(j, "model_type");
    p.family = mt ? json_fields::Field{"[pretrained]", where, "model_type"}.string(*mt) : "";
    p.config = config_from_family(p.family, text, where);
  } else {
    p.format = "safetensors";  // full weights in our names: the caller gives the config
  }
  read_hf_tokenizer(p, dir);
}

}  // namespace

nn::TransformerConfig config_from_family(const std::string& family, const std::string& config_json,
                                         const std::string& where) {
  if (family == "minillm") return nn::TransformerConfig::from_json(config_json);  // our own names
  const models::ModelSpec* spec = models::spec_for_hf_model_type(family);
  FSDP_CHECK(spec, "[pretrained] {}: model family '{}' is not supported; known: {}, minillm", where,
             family, models::hf_model_types());
  return spec->read_hf_config(config_json, where);
}

namespace {
// The sizes and ids a file's header or config says, checked against the tensors it holds before
// anything is built from them: the last layer must be there (a header's layer count is not
// believed on its own), the embedding must be [vocab, dim], and bos/eos/end-of-turn must be ids of
// that vocabulary.
void check_against_tensors(const Pretrained& p, const PretrainedSource& src) {
  if (!p.config) return;
  const nn::TransformerConfig& cfg = *p.config;
  const bool g = src.gguf.has_value();
  auto has = [&](const std::string& n) {
    return g ? src.gguf->contains(n) : src.find(n) != nullptr;
  };
  auto shape_of = [&](const std::string& n) {
    return g ? src.gguf->tensor(n).shape() : src.find(n)->shape();
  };
  const std::string field = g ? p.family + ".block_count"
                              : (p.format == "hf" ? "num_hidden_layers" : "layers");
  FSDP_CHECK(cfg.layers >= 1, "[pretrained] {}: {} is {}; expected at least 1 layer", p.path,
             field, cfg.layers);
  const std::string last = std::to_string(cfg.layers - 1);
  std::vector<std::string> names;
  if (g) {
    names = {"blk." + last + ".attn_norm.weight"};
  } else {
    names = {"model.layers." + last + ".input_layernorm.weight",
             "layers." + last + ".norm1.weight"};
  }
  bool found = false;
  for (const auto& n : names) found = found || has(n);
  FSDP_CHECK(found, "[pretrained] {}: {} is {} but there is no tensor named '{}'{}", p.path, field,
             cfg.layers, names[0], names.size() > 1 ? fmt::format(" nor '{}'", names[1]) : "");
  // Every layer index 0..layers-1, and no other, among the tensors' names: a header that names
  // 1e6 layers over a file with two is refused here, not built (a module tree of 1e6 blocks).
  std::set<int64_t> seen;
  auto note_layer = [&](const std::string& n) {
    for (const std::string_view pre : {"blk.", "model.layers.", "layers."}) {
      if (!n.starts_with(pre)) continue;
      int64_t i = 0;
      size_t at = pre.size(), digits = 0;
      for (; at < n.size() && n[at] >= '0' && n[at] <= '9' && digits < 12; ++at, ++digits)
        i = i * 10 + (n[at] - '0');
      if (digits > 0 && at < n.size() && n[at] == '.') seen.insert(i);
      return;
    }
  };
  if (g) {
    for (const GgufTensorInfo& t : src.gguf->tensors()) note_layer(t.name);
  } else {
    for (const auto& [n, t] : src.by_name) note_layer(n);
  }
  FSDP_CHECK(int64_t(seen.size()) == cfg.layers && *seen.rbegin() == cfg.layers - 1,
             "[pretrained] {}: {} is {} but its tensors name only {} distinct layers (from {} "
             "to {}); a model of {} layers needs every one of 0 to {}",
             p.path, field, cfg.layers, seen.size(), seen.empty() ? 0 : *seen.begin(),
             seen.empty() ? 0 : *seen.rbegin(), cfg.layers, cfg.layers - 1);
  for (const std::string& e : {std::string(g ? "token_embd.weight" : "model.embed_tokens.weight"),
                               std::string("embed.weight")}) {
    if (!has(e)) continue;
    const Shape s = shape_of(e);
    FSDP_CHECK(s == Shape({cfg.vocab, cfg.dim}),
               "[pretrained] {}: '{}' has shape {} but vocab {} and dim {} need [{}, {}]", p.path,
               e, shape_str(s), cfg.vocab, cfg.dim, cfg.vocab, cfg.dim);
    break;
  }
  const std::pair<const char*, std::optional<int32_t>> ids[] = {
      {"bos_token_id", p.bos_id}, {"eos_token_id", p.eos_id}, {"end-of-turn id", p.eot_id}};
  for (const auto& [what, id] : ids)
    FSDP_CHECK(!id || (*id >= 0 && *id < cfg.vocab),
               "[pretrained] {}: {} is {}, outside the model's vocabulary [0, {})", p.path, what,
               *id, cfg.vocab);
}

// Refuses a weight that holds NaN or Inf, naming the tensor (f32 values of it).
void check_finite(const std::string& path, const std::string& name, const Tensor& t) {
  const Tensor c = t.contiguous();
  const float* v = c.data<float>();
  const int64_t n = c.numel();
  for (int64_t i = 0; i < n; ++i)
    FSDP_CHECK(std::isfinite(v[i]),
               "[pretrained] {}: tensor '{}' holds {} (element {} of {}); refusing a model with "
               "non-finite weights",
               path, name, std::isnan(v[i]) ? "NaN" : "Inf", i, n);
}
}  // namespace

namespace {
void check_one_layer_shapes(const Pretrained& p, const PretrainedSource& src);
}  // namespace

Pretrained load_pretrained(const std::string& path) {
  std::error_code ec;
  FSDP_CHECK(fs::exists(path, ec), "[pretrained] cannot open '{}': no such file or directory",
             path);
  Pretrained p;
  p.path = path;
  auto src = std::make_shared<PretrainedSource>();
  src->path = path;
  bool gguf = false;
  if (!fs::is_directory(path)) {
    check_regular(path, "[pretrained]");
    std::ifstream f(path, std::ios::binary);
    char magic[4] = {};
    f.read(magic, 4);
    gguf = f.gcount() == 4 && std::string(magic, 4) == "GGUF";
  }
  if (gguf)
    open_gguf(p, *src);
  else
    open_safetensors(p, *src);
  check_against_tensors(p, *src);
  check_one_layer_shapes(p, *src);
  p.source = std::move(src);
  return p;
}

namespace {

// One stored tensor of the file: its shape in PyTorch's order, and its rows [a, b) of dim 0 in
// f32 (1-D tensors: elements). GGUF reads only those rows' blocks (q/k in Hugging Face's order);
// safetensors touches only those rows' bytes.
struct Stored {
  const PretrainedSource* src = nullptr;
  std::string name;
  Shape shape;
  Tensor rows(int64_t a, int64_t b) const {
    if (src->gguf) {
      if (shape.size() == 1) {
        Tensor t = src->gguf->read(name, RowOrder::hf).slice(a, b).contiguous();
        check_finite(src->path, name, t);
        // llama.cpp's gemma converters store Gemma's (1 + w) norms as 1 + w; ours hold w.
        if (name.ends_with("norm.weight") &&
            src->gguf->get_string("general.architecture", "") == "gemma3") {
          float* v = t.data<float>();
          for (int64_t i = 0; i < t.numel(); ++i) v[i] -= 1.0f;
        }
        return t;
      }
      Tensor t = src->gguf->read_rows(name, a, b, RowOrder::hf);
      Shape s = shape;
      s[0] = b - a;
      check_finite(src->path, name, t);
      return t.view(s);
    }
    Tensor t = src->find(name)->slice(a, b).to(DType::f32);
    check_finite(src->path, name, t);
    return t;
  }
};

std::optional<Stored> stored(const PretrainedSource& s, const std::string& name) {
  if (s.gguf) {
    if (!s.gguf->contains(name)) return std::nullopt;
    return Stored{&s, name, s.gguf->tensor(name).shape()};
  }
  const Tensor* t = s.find(name);
  if (!t) return std::nullopt;
  return Stored{&s, name, t->shape()};
}

// The tensors that hold our parameter `name`, each with the rows of the parameter it fills: one
// for most, q/k/v for the packed in-projection (and its bias).
std::vector<std::pair<Stored, int64_t>> parts_of(const PretrainedSource& s,
                                                 const nn::TransformerConfig& cfg,
                                                 const std::string& name) {
  auto missing = [&](const std::string& other) {
    FSDP_FAIL("[init-from] {}: no tensor named '{}'{}", s.path, name,
              other.empty() || other == name ? "" : fmt::format(" nor '{}'", other));
  };
  if (s.gguf) {
    if (is_in_proj(name) || is_in_proj_bias(name)) {
      const auto rows = in_proj_rows(cfg);
      const auto names = detail::in_proj_names(name, detail::Naming::gguf);
      std::vector<std::pair<Stored, int64_t>> out;
      for (size_t i = 0; i < 3; ++i) {
        const std::string& n = names[i];
        auto st = stored(s, n);
        if (!st) missing(n);
        out.emplace_back(*st, rows[i].first);
      }
      return out;
    }
    const std::string n = gguf_name(name, cfg.sandwich_norms);
    auto st = stored(s, n);
    if (!st) missing(n);
    return {{*st, 0}};
  }
  if (auto st = stored(s, name)) return {{*st, 0}};
  if (cfg.arch != nn::Arch::llama) missing("");
  if (is_in_proj(name) || is_in_proj_bias(name)) {
    const auto rows = in_proj_rows(cfg);
    const auto names = detail::in_proj_names(name, detail::Naming::hf);
    std::vector<std::pair<Stored, int64_t>> out;
    for (size_t i = 0; i < 3; ++i) {
      auto st = stored(s, names[i]);
      if (!st) missing(names[i]);
      out.emplace_back(*st, rows[i].first);
    }
    return out;
  }
  const std::string hf = hf_name(name, cfg.sandwich_norms);
  auto st = stored(s, hf);
  if (!st) missing(hf);
  return {{*st, 0}};
}

// The parameter's shape as the file holds it (q/k/v stacked), checked against `want`.
void check_shape(const PretrainedSource& s, const nn::TransformerConfig& cfg,
                 const std::string& name, const std::vector<std::pair<Stored, int64_t>>& parts,
                 const Shape& want) {
  const auto rows = in_proj_rows(cfg);
  for (size_t i = 0; i < parts.size(); ++i) {
    const Stored& st = parts[i].first;
    Shape need = want;
    if (parts.size() == 3) need[0] = rows[i].second - rows[i].first;
    FSDP_CHECK(st.shape == need,
               "[init-from] {}: '{}' has shape {} but the model ({} heads, {} kv heads of {}, "
               "dim {}) needs {} for '{}'",
               s.path, st.name, shape_str(st.shape), cfg.heads, cfg.resolved_kv_heads(),
               cfg.resolved_head_dim(), cfg.dim, shape_str(need), name);
  }
}

// Before the model is built: the shape of every parameter outside the blocks and of block 0's,
// from a one-block model of the config (shapes only, no storage), against the file's tensors.
// With the layer count already held to the file's layers, a crafted width (intermediate_size
// 1e9) is refused by name here, not allocated.
void check_one_layer_shapes(const Pretrained& p, const PretrainedSource& src) {
  if (!p.config) return;
  nn::TransformerConfig one = *p.config;
  one.layers = 1;
  nn::Transformer shapes(one);
  for (auto& [name, param] : shapes.named_parameters())
    check_shape(src, one, name, parts_of(src, one, name), param->shape);
}

// Rows [a, b) of the parameter, read (dequantized, checked finite) a chunk of at most 4 M values
// at a time: the f32 copy of a rank's rows of a 262k-row embedding never exists whole beside its
// shard. Each chunk goes to `use(first row, chunk)`.
template <class Use>
void for_row_chunks(const std::vector<std::pair<Stored, int64_t>>& parts, int64_t a, int64_t b,
                    Use&& use) {
  for (const auto& [st, at] : parts) {
    const int64_t lo = std::max(a, at), hi = std::min(b, at + st.shape[0]);
    if (lo >= hi) continue;
    const int64_t row = st.shape.size() > 1 ? shape_numel(st.shape) / st.shape[0] : 1;
    const int64_t step = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(1, row));
    for (int64_t c = lo; c < hi; c += step) {
      const int64_t e = std::min(hi, c + step);
      use(c, st.rows(c - at, e - at));
    }
  }
}

// Rows [a, b) of the parameter into `dst` ([b - a, ...], any dtype or device).
void fill_rows(const std::vector<std::pair<Stored, int64_t>>& parts, int64_t a, int64_t b,
               const Tensor& dst) {
  for_row_chunks(parts, a, b, [&](int64_t first, const Tensor& rows) {
    dst.narrow(0, first - a, rows.shape()[0]).copy_(rows);
  });
}

}  // namespace

Tensor Pretrained::read_rows(const nn::TransformerConfig& cfg, const std::string& name,
                             int64_t begin, int64_t end) const {
  auto parts = parts_of(*source, cfg, name);
  Shape shape = parts[0].first.shape;
  if (parts.size() == 3) shape[0] = in_proj_rows(cfg)[2].second;
  FSDP_CHECK(0 <= begin && begin <= end && end <= shape[0],
             "[pretrained] {}: rows [{}, {}) of '{}' are outside its {} rows", path, begin, end,
             name, shape[0]);
  check_shape(*source, cfg, name, parts, shape);
  shape[0] = end - begin;
  Tensor out = Tensor::empty(shape, DType::f32);
  fill_rows(parts, begin, end, out);
  return out;
}

Tensor Pretrained::read(const nn::TransformerConfig& cfg, const std::string& name) const {
  auto parts = parts_of(*source, cfg, name);
  if (parts.size() == 1 && !source->gguf) {
    const Tensor* t = source->find(parts[0].first.name);
    if (t->dtype() == DType::f32) {  // in place, zero copy
      check_finite(path, parts[0].first.name, *t);
      return *t;
    }
  }
  const int64_t rows = parts.size() == 3 ? in_proj_rows(cfg)[2].second : parts[0].first.shape[0];
  return read_rows(cfg, name, 0, rows);
}

std::optional<PackedRows> Pretrained::packed_rows(const nn::TransformerConfig& cfg,
                                                  const std::string& name) const {
  if (!source->gguf) return std::nullopt;
  auto parts = parts_of(*source, cfg, name);
  if (parts[0].first.shape.size() != 2) return std::nullopt;
  PackedRows out;
  int64_t rows = 0;
  for (const auto& [st, at] : parts) {
    const GgufTensorInfo& ti = source->gguf->tensor(st.name);
    FSDP_CHECK(at == rows, "[init-from] {}: '{}' fills rows from {}, after {} rows", path, st.name,
               at, rows);
    FSDP_CHECK(ggml_type_readable(ti.type),
               "[init-from] {}: tensor '{}' is {}; fsdp.cpp dequantizes {}", path, st.name,
               ggml_type_name(ti.type), ggml_readable_type_names());
    out.runs.push_back({ti.rows(), int64_t(ti.row_bytes()), ti.type});
    rows += ti.rows();
  }
  out.decode = [](uint32_t type, const uint8_t* src, float* dst, int64_t n) {
    dequantize_row(type, src, dst, n);
  };
  return out;
}

void Pretrained::load_into(nn::Transformer& model, FSDPModule* root) const {
  const nn::TransformerConfig& cfg = model.config();
  // A LoRA run's adapters are not the model's: they keep their initial values (B zero).
  if (!root) {
    for (auto& [name, p] : model.named_parameters()) {
      if (nn::is_lora_parameter(name)) continue;
      auto parts = parts_of(*source, cfg, name);
      check_shape(*source, cfg, name, parts, p->shape);
      FSDP_CHECK(p->data.defined(), "[pretrained] load_into: '{}' has no storage", name);
      fill_rows(parts, 0, p->shape[0], p->data);
    }
    return;
  }
  // Each rank's rows of each Shard(0) parameter (torch.chunk's split of dim 0), written into the
  // shard buffers that the optimizer steps.
  auto groups = root->param_groups(0);
  for (const auto& in : root->shard_infos()) {
    if (nn::is_lora_parameter(in.name)) continue;
    auto parts = parts_of(*source, cfg, in.name);
    check_shape(*source, cfg, in.name, parts, in.global_shape);
    if (in.local_rows == 0) continue;
    const int64_t row = shape_numel(in.global_shape) / in.global_shape[0];
    Shape local = in.global_shape;
    local[0] = in.local_rows;
    if (in.packed) {  // the stored rows' bytes, as they are
      const int64_t a = in.local_begin, b = a + in.local_rows;
      auto* dst = static_cast<uint8_t*>(groups[in.group].params.raw_data()) + in.offset;
      int64_t wrote = 0;
      for (const auto& [st, at] : parts) {
        const int64_t lo = std::max(a, at), hi = std::min(b, at + st.shape[0]);
        if (lo >= hi) continue;
        source->gguf->read_row_bytes(st.name, lo - at, hi - at, RowOrder::hf, dst + wrote);
        wrote += (hi - lo) * int64_t(source->gguf->tensor(st.name).row_bytes());
      }
      FSDP_CHECK(wrote == in.packed_bytes,
                 "[init-from] {}: '{}' took {} bytes of this rank's rows where its shard holds {}",
                 path, in.name, wrote, in.packed_bytes);
      for_row_chunks(parts, a, b, [](int64_t, const Tensor&) {});  // the values are finite
      continue;
    }
    Tensor dst =
        groups[in.group].params.slice(in.offset, in.offset + in.local_rows * row).view(local);
    fill_rows(parts, in.local_begin, in.local_begin + in.local_rows, dst);
  }
}

void Pretrained::release_file_pages() const {
  if (source && source->gguf) source->gguf->release_pages();
}

std::string model_identity(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return data::data_identity(path).str();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(path))
    if (e.is_regular_file()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names)
    out += (out.empty() ? "" : "; ") + n + ": " +
           data::data_identity((fs::path(path) / n).string()).str();
  return out;
}

std::optional<int32_t> end_of_turn_id(const data::Tokenizer& tok, const std::string& raw_template,
                                      std::optional<int32_t> eos) {
  const std::string chat_template = data::without_jinja_comments(raw_template);
  for (const char* end : {"<|im_end|>", "<end_of_turn>", "<|eot_id|>"})
    if (chat_template.find(end) != std::string::npos)
      if (auto id = token_id(tok, end)) return id;
  return eos;
}

void set_chat_template(Pretrained& p, const std::string& jinja_file) {
  check_regular(jinja_file, "[pretrained] chat template");
  p.chat_template = read_text(jinja_file);
  FSDP_CHECK(!p.chat_template.empty(), "[pretrained] chat template {} is empty", jinja_file);
  set_eot(p);
}

std::string render_chat(const std::string& chat_template, const std::string& user,
                        const std::optional<std::string>& system) {
  data::Conversation chat;
  if (system) chat.push_back({"system", *system});
  chat.push_back({"user", user});
  return data::render(data::ChatFormat::recognize(chat_template), chat, true).text;
}

}  // namespace fsdp::checkpoint
