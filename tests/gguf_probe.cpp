// The GGUF reader seen from outside, for tests/gguf_test.py (which holds it to gguf-py, llama.cpp's
// own reader, and to Hugging Face tokenizers):
//   gguf_probe info FILE            the header, metadata, tensor index, llama config and Hugging
//                                   Face names as JSON on stdout;
//   gguf_probe rows FILE OUTDIR     for each stdin line "NAME BEGIN END file|hf f32|f64", writes
//                                   read_rows()' values raw to OUTDIR/<line number>.bin;
//   gguf_probe tokenize FILE        for each stdin line (a JSON string), the ids as a JSON line;
//                                   the ids must decode back to the text (else exit 3).
// A refused file prints the fsdp::Error on stderr and exits 1; nothing else may happen to it.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/core/error.h"
#include "fsdp/models/spec.h"
#include "fsdp/models/state_dict_adapter.h"
#include "fsdp/nn/transformer.h"

using fsdp::checkpoint::GgufFile;
using nlohmann::json;

namespace {

json value_json(const fsdp::checkpoint::GgufValue& v) {
  using fsdp::checkpoint::GgufType;
  if (v.is_array()) {
    json a = json::array();
    for (int64_t x : v.integers) a.push_back(x);
    for (double x : v.reals) a.push_back(x);
    for (const auto& s : v.strs) a.push_back(s);
    return a;
  }
  if (v.type == GgufType::string) return v.str;
  if (v.type == GgufType::f32 || v.type == GgufType::f64) return v.real;
  if (v.type == GgufType::boolean) return v.integer != 0;
  return v.integer;
}

int info(const GgufFile& f) {
  json j = {
      {"version", f.version()}, {"alignment", f.alignment()}, {"data_offset", f.data_offset()}};
  json kv = json::object();
  for (const std::string& k : f.keys()) kv[k] = value_json(f.at(k));
  j["metadata"] = kv;
  json ts = json::array();
  for (const auto& t : f.tensors())
    ts.push_back({{"name", t.name},
                  {"ne", t.ne},
                  {"type", t.type},
                  {"type_name", fsdp::checkpoint::ggml_type_name(t.type)},
                  {"offset", t.offset},
                  {"nbytes", t.nbytes}});
  j["tensors"] = ts;
  if (f.has("tokenizer.ggml.model")) {
    auto ti = fsdp::checkpoint::gguf_tokenizer_info(f);
    auto opt = [](const std::optional<int32_t>& o) { return o ? json(*o) : json(nullptr); };
    j["tokenizer"] = {
        {"model", ti.model},     {"pre", ti.pre},         {"bos", opt(ti.bos)},
        {"eos", opt(ti.eos)},    {"pad", opt(ti.pad)},    {"unk", opt(ti.unk)},
        {"add_bos", ti.add_bos}, {"add_eos", ti.add_eos}, {"chat_template", ti.chat_template}};
  }
  if (f.get_string("general.architecture", "") == "llama" && f.contains("token_embd.weight")) {
    const fsdp::nn::TransformerConfig c = fsdp::checkpoint::config_from_gguf(f);
    j["llama_config"] = {{"vocab", c.vocab},
                         {"dim", c.dim},
                         {"layers", c.layers},
                         {"heads", c.heads},
                         {"kv_heads", c.resolved_kv_heads()},
                         {"head_dim", c.resolved_head_dim()},
                         {"ffn_hidden", c.resolved_ffn_hidden()},
                         {"context", f.get_int("llama.context_length", 0)},
                         {"rope_theta", c.rope_theta},
                         {"norm_eps", c.norm_eps.value_or(0.0)},
                         {"tied", c.tie_embeddings}};
    if (c.rope_scaling.enabled())
      j["llama_config"]["rope_scaling"] = {{"factor", c.rope_scaling.factor},
                                           {"low_freq_factor", c.rope_scaling.low_freq_factor},
                                           {"high_freq_factor", c.rope_scaling.high_freq_factor},
                                           {"original_context", c.rope_scaling.original_context}};
  }
  json names = json::object();
  // Through the state-dict adapter of the file's family ("" for every name of an architecture no
  // family has).
  const fsdp::models::ModelSpec* spec =
      fsdp::models::spec_for_gguf_arch(f.get_string("general.architecture", ""));
  for (const auto& t : f.tensors())
    names[t.name] = spec ? spec->adapter->rename(t.name, fsdp::models::Naming::gguf,
                                                 fsdp::models::Naming::hf)
                         : "";
  j["hf_names"] = names;
  std::cout << j.dump() << "\n";
  return 0;
}

int rows(const GgufFile& f, const std::string& outdir) {
  std::string line;
  for (int n = 0; std::getline(std::cin, line); ++n) {
    std::istringstream ss(line);
    std::string name, order, dtype;
    int64_t b = 0, e = 0;
    ss >> name >> b >> e >> order >> dtype;
    FSDP_CHECK(
        !ss.fail() && (order == "file" || order == "hf") && (dtype == "f32" || dtype == "f64"),
        "[gguf_probe] bad request line '{}'", line);
    fsdp::Tensor t = f.read_rows(
        name, b, e,
        order == "hf" ? fsdp::checkpoint::RowOrder::hf : fsdp::checkpoint::RowOrder::file,
        dtype == "f64" ? fsdp::DType::f64 : fsdp::DType::f32);
    std::ofstream o(outdir + "/" + std::to_string(n) + ".bin", std::ios::binary);
    o.write(static_cast<const char*>(t.raw_data()), std::streamsize(t.nbytes()));
    FSDP_CHECK(o.good(), "[gguf_probe] cannot write into '{}'", outdir);
  }
  return 0;
}

int tokenize(const GgufFile& f) {
  const fsdp::data::Tokenizer tok = fsdp::checkpoint::gguf_tokenizer(f);
  std::string line;
  while (std::getline(std::cin, line)) {
    const std::string text = json::parse(line).get<std::string>();
    const std::vector<int32_t> ids = tok.encode(text);
    if (tok.decode(ids, /*keep_special=*/true) != text) {
      std::cerr << "gguf_probe: decode(encode(" << line << ")) differs\n";
      return 3;
    }
    std::cout << json(ids).dump() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: gguf_probe info|rows|tokenize FILE [OUTDIR]\n";
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    const GgufFile f(argv[2]);
    if (cmd == "info") return info(f);
    if (cmd == "rows" && argc >= 4) return rows(f, argv[3]);
    if (cmd == "tokenize") return tokenize(f);
    std::cerr << "gguf_probe: unknown command '" << cmd << "'\n";
    return 2;
  } catch (const fsdp::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
