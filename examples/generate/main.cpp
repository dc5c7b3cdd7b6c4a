// fsdp-generate: samples text from a trained MiniLLM.
//   fsdp-generate --model model.safetensors --prompt "The " --tokens 200
//   fsdp-generate --ckpt ckpts/ --prompt "The "
// A safetensors file (as fsdp-export writes it) is memory-mapped and its
// tensors used in place, with no copy (the llama architecture's q/k/v under
// Hugging Face names are concatenated once into the packed in-projection).
// A checkpoint directory is consolidated in memory. Sampling: temperature and
// top-k over a byte vocabulary, the window recomputed each token (no KV cache).
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/nn/init.h"
#include "fsdp/nn/sample.h"

int main(int argc, char** argv) {
  using namespace fsdp;
  std::string model_path, ckpt, prompt = "The ";
  int64_t tokens = 200, top_k = 40;
  double temperature = 0.8;
  uint64_t seed = 1;
  int threads = 0;
  CLI::App app{"fsdp-generate: sample text from a MiniLLM", "fsdp-generate"};
  app.add_option("--model", model_path, "safetensors file written by fsdp-export (memory-mapped)");
  app.add_option("--ckpt", ckpt, "checkpoint directory, or a --ckpt-dir (its newest checkpoint)");
  app.add_option("--prompt", prompt, "text to continue")->capture_default_str();
  app.add_option("--tokens", tokens, "bytes to generate")->capture_default_str();
  app.add_option("--temperature", temperature, "sampling temperature (0: greedy)")
      ->capture_default_str();
  app.add_option("--top-k", top_k, "sample among the k likeliest (0: all)")->capture_default_str();
  app.add_option("--seed", seed, "sampling seed")->capture_default_str();
  app.add_option("--threads", threads, "OpenMP threads (0: all cores)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    FSDP_CHECK(model_path.empty() != ckpt.empty(),
               "[fsdp-generate] give exactly one of --model and --ckpt");
    FSDP_CHECK(tokens >= 0 && top_k >= 0 && temperature >= 0,
               "[fsdp-generate] --tokens, --top-k and --temperature must be >= 0");
    if (threads > 0) omp_set_num_threads(threads);
    nn::MiniLLMConfig cfg;
    std::unique_ptr<nn::MiniLLM> model;
    checkpoint::SafetensorsFile mapped;
    if (!model_path.empty()) {
      mapped = checkpoint::map_safetensors(model_path);
      FSDP_CHECK(mapped.metadata.count("fsdp.config"),
                 "[fsdp-generate] {} has no fsdp.config metadata (write it with "
                 "fsdp-export)",
                 model_path);
      cfg = nn::MiniLLMConfig::from_json(mapped.metadata.at("fsdp.config"));
      model = std::make_unique<nn::MiniLLM>(cfg);
      checkpoint::SafetensorsIndex index(model_path);
      int64_t zero_copy = 0, copied = 0;
      for (auto& [name, p] : model->named_parameters()) {
        const std::string hf = checkpoint::hf_name(name);
        const std::string key =
            mapped.contains(name) ? name : (!hf.empty() && mapped.contains(hf) ? hf : "");
        if (!key.empty()) {
          p->data = mapped.at(key);  // a view of the mapping
          ++zero_copy;
        } else {
          p->data =
              checkpoint::read_param(index, cfg, name).to(mapped.tensors.front().second.dtype());
          ++copied;
        }
      }
      fmt::print("generate: mapped {} ({} tensors in place, {} assembled)\n", model_path, zero_copy,
                 copied);
    } else {
      std::string path = ckpt;
      if (!std::filesystem::exists(std::filesystem::path(ckpt) / "metadata.json"))
        path = checkpoint::latest(ckpt);
      FSDP_CHECK(!path.empty(), "[fsdp-generate] no checkpoint in '{}'", ckpt);
      auto tensors = checkpoint::consolidate(path, &cfg);
      model = std::make_unique<nn::MiniLLM>(cfg);
      for (auto& [name, t] : tensors) model->parameter(name).data = t;
      fmt::print("generate: loaded {}\n", path);
    }
    std::vector<int32_t> ctx;
    for (unsigned char ch : prompt) ctx.push_back(int32_t(ch) % int32_t(cfg.vocab));
    auto t0 = std::chrono::steady_clock::now();
    std::string out;
    for (int32_t id : nn::sample(*model, ctx,
                                 {.tokens = tokens,
                                 .temperature = temperature,
                                 .top_k = top_k,
                                 .max_id = 256,
                                 .seed = seed}))
      out.push_back((id < 32 && id != '\n') ? ' ' : char(id));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("{}{}\n", prompt, out);
    fmt::print("generate: {} tokens in {:.2f} s, {:.1f} tokens/s\n", tokens, s,
               double(tokens) / std::max(s, 1e-9));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fsdp-generate: error: {}\n", e.what());
    return 1;
  }
}
