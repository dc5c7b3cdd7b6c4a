// load_pretrained: one loader for Hugging Face folders, safetensors files and GGUF files
// (fsdp/checkpoint/pretrained.h). Files are mapped; a parameter's rows are read only when asked
// for (pretrained_rows.cpp), so a sharded rank touches only the bytes of its own rows. This file
// opens the formats and checks their tensors against the config; the tokenizer files are read by
// pretrained_tokenizer.cpp.
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
#include "fsdp/models/state_dict_adapter.h"
#include "fsdp/nn/transformer.h"
#include "src/core/json_fields.h"
#include "src/core/json_read.h"
#include "src/checkpoint/gguf_format_names.h"
#include "src/checkpoint/pretrained_impl.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace pretrained_detail;


namespace {


using models::is_in_proj;
using models::is_in_proj_bias;


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
  FSDP_CHECK(
      spec && spec->read_gguf_config,
      "[gguf] {}: general.architecture '{}' is not read{}; fsdp.cpp reads {}", f.path(), arch,
      spec ? fmt::format(" (the {} family's GGUF files are not read yet)", spec->name) : "",
      models::gguf_archs());
  // Named by its options, not by the file's architecture: llama.cpp's architecture with experts
  // is another family's.
  return models::named_config(spec->read_gguf_config(GgufHeaderOf(f)));
}

namespace {

void open_gguf(Pretrained& p, PretrainedSource& src) {
  src.gguf.emplace(p.path);
  const GgufFile& f = *src.gguf;
  p.format = "gguf";
  p.family = f.get_string("general.architecture", "");
  p.config = config_from_gguf(f);
  if (const std::string model = f.get_string("tokenizer.ggml.model", "");
      !model.empty() && model != gguf_format::kByteLevelBpe &&
      model != gguf_format::kSentencePiece) {
    p.tokenizer_unread =
        fmt::format("{}: its tokenizer (tokenizer.ggml.model '{}') is not read: fsdp.cpp reads {}",
                    p.path, model, gguf_format::kTokenizerModels);
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
    p.chat_template_source = f.path() + "'s tokenizer.chat_template";
    p.bos_id = info.bos;
    p.eos_id = info.eos;
    set_eot(p);
    if (f.has("tokenizer.ggml.eot_token_id"))
      p.eot_id = int32_t(f.get_int("tokenizer.ggml.eot_token_id"));
  }
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
  if (family == "minillm")  // our own names (an export before configs named their family too)
    return models::named_config(nn::TransformerConfig::from_json(config_json));
  const models::ModelSpec* spec = models::spec_for_hf_model_type(family);
  FSDP_CHECK(spec, "[pretrained] {}: model family '{}' is not supported; known: {}, minillm", where,
             family, models::hf_model_types());
  return models::named_config(spec->read_hf_config(config_json, where));
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
  // Names as the family's adapter gives them in the file's naming (GGUF's, or Hugging Face's
  // beside our own in a safetensors file), ours alone for a family with no other.
  const models::StateDictAdapter* adapter = models::spec_to_train(cfg).adapter;
  const models::Naming naming = g ? models::Naming::gguf : models::Naming::hf;
  auto file_names = [&](const std::string& ours) {
    std::vector<std::string> out;
    if (adapter) out.push_back(adapter->rename(ours, models::Naming::ours, naming));
    if (!g || !adapter) out.push_back(ours);
    return out;
  };
  // The last layer's first parameter of the family's block (a one-block model's, shapes only; the
  // in-projection, which other namings split, passed over): "norm1.weight" for nn::TransformerBlock.
  std::string first = "norm1.weight";
  {
    nn::TransformerConfig one = cfg;
    one.layers = 1;
    std::erase_if(one.moe.dense_layers, [](int64_t layer) { return layer >= 1; });
    const auto block = models::spec_to_train(one).build(one);
    for (auto& [n, param] : block->named_parameters())
      if (n.starts_with("layers.0.") && !models::is_in_proj(n) && !models::is_in_proj_bias(n)) {
        first = n.substr(std::string_view("layers.0.").size());
        break;
      }
  }
  const std::string last = std::to_string(cfg.layers - 1);
  const std::vector<std::string> names = file_names("layers." + last + "." + first);
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
  for (const std::string& e : file_names("embed.weight")) {
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

}  // namespace fsdp::checkpoint
