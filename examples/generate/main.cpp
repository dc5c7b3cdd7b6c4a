// fsdp-generate: text from a trained model, or from a pretrained one (Hugging Face, GGUF).
//   fsdp-generate --model out/model.safetensors --prompt "The " --tokens 200
//   fsdp-generate --model hf_llama_dir/ --prompt "The " --device cuda
//   fsdp-generate --ckpt ckpts/ --prompt "The " --top-p 0.9
//   fsdp-generate --model out/model.safetensors --prompt "The license" --print-logits
//   fsdp-generate --model SmolLM2-135M-Instruct.Q4_1.gguf --chat "Hi" --temperature 0
// --model takes fsdp-export's safetensors (its config in the metadata), a Hugging Face
// save_pretrained folder (config.json and model.safetensors, or its index over several files),
// one of its files, or a llama.cpp GGUF file, through the library's load_pretrained; safetensors
// are memory-mapped and used in place where their dtype is the compute one. --chat renders the
// model's chat template (run by the Jinja engine, as transformers runs it) and stops at the end of
// the turn.
// --ckpt consolidates a checkpoint in memory. The tokenizer is --tokenizer's, else the
// tokenizer.json beside the model or saved in the checkpoint, else the bytes. Text goes to stdout
// as it is sampled; everything else to stderr.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/core/device.h"
#include "fsdp/core/error.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/spec.h"
#include "fsdp/nn/sample.h"
#include "fsdp/ops/blas.h"

namespace {

using namespace fsdp;
namespace fs = std::filesystem;

struct Loaded {
  nn::TransformerConfig cfg;
  std::unique_ptr<nn::Transformer> model;
  std::optional<data::Tokenizer> tokenizer;  // found beside the model or in the checkpoint
  checkpoint::Pretrained pre;                // --model: the model's template and ids
  std::string what;
};

// fsdp-export's file, a Hugging Face folder / file (config.json beside it) or a GGUF file: the
// library's load_pretrained, the one loader fsdp-train's --init-from uses too. f32 safetensors
// are used in place (zero copy); everything else is read (GGUF dequantized) once.
Loaded load_model(const std::string& path, DType compute, Device device) {
  Loaded l;
  l.pre = checkpoint::load_pretrained(path);
  FSDP_CHECK(l.pre.config,
             "[fsdp-generate] {} has no fsdp.config metadata and no config.json beside it: "
             "give fsdp-export's file, a Hugging Face Llama folder or a GGUF file",
             path);
  l.cfg = *l.pre.config;
  l.model = models::spec_to_train(l.cfg).build(l.cfg);
  int64_t in_place = 0, converted = 0;
  for (auto& [name, p] : l.model->named_parameters()) {
    Tensor value = l.pre.read(l.cfg, name);
    FSDP_CHECK(value.shape() == p->shape,
               "[fsdp-generate] {}: '{}' has shape {} but the model "
               "needs {}",
               path, name, shape_str(value.shape()), shape_str(p->shape));
    if (value.dtype() == compute && device.is_cpu()) {
      ++in_place;
    } else {
      value = value.to(compute).to(device);
      ++converted;
    }
    p->data = value;
  }
  l.what = fmt::format("{} ({}{}{}, {} tensors {}, {} converted or moved)", path, l.pre.format,
                       l.pre.family.empty() ? "" : " ", l.pre.family, in_place,
                       l.pre.format == "gguf" ? "dequantized" : "in place", converted);
  l.tokenizer = l.pre.tokenizer;
  return l;
}

Loaded load_checkpoint(const std::string& ckpt, DType compute, Device device) {
  std::string path = ckpt;
  if (!fs::exists(fs::path(ckpt) / "metadata.json")) path = checkpoint::latest(ckpt);
  FSDP_CHECK(!path.empty(), "[fsdp-generate] no checkpoint in '{}'", ckpt);
  Loaded l;
  auto tensors = checkpoint::consolidate(path, &l.cfg);
  l.model = models::spec_to_train(l.cfg).build(l.cfg);
  for (auto& [name, t] : tensors) l.model->parameter(name).data = t.to(compute).to(device);
  if (auto saved = checkpoint::read_extra_file(path, "tokenizer.json"))
    l.tokenizer = data::Tokenizer::from_json(*saved, path + "/tokenizer.json");
  // A fine-tuned pretrained model's ids and chat template (fsdp-train --init-from saved them).
  if (auto m = checkpoint::read_extra_file(path, "tokenizer_meta.json"); m && l.tokenizer) {
    const auto meta = checkpoint::TokenizerMeta::from_json(*m, path + "/tokenizer_meta.json");
    l.pre.chat_template = meta.chat_template;
    l.pre.bos_id = meta.bos;
    l.pre.eos_id = meta.eos;
    l.pre.eot_id = checkpoint::end_of_turn_id(*l.tokenizer, meta.chat_template, meta.eos);
  }
  l.what = path;
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::ops::use_best_blas_kernel(argv);  // before anything else: it may re-execute
  std::string model_path, ckpt, prompt = "The ", tokenizer_path, device_name = "cpu",
                                dtype_name_s = "f32";
  int64_t tokens = 200, top_k = 40;
  double temperature = 0.8, top_p = 1.0;
  uint64_t seed = 1;
  int threads = 0;
  bool no_cache = false, print_logits = false, ignore_eos = false;
  std::optional<std::string> chat, system;
  CLI::App app{
      "fsdp-generate: sample text from a trained or a pretrained model (Hugging Face, GGUF)",
      "fsdp-generate"};
  app.add_option("--model", model_path,
                 "fsdp-export's safetensors, or a Hugging Face Llama folder or file");
  app.add_option("--ckpt", ckpt, "checkpoint directory, or a --ckpt-dir (its newest checkpoint)");
  app.add_option("--tokenizer", tokenizer_path,
                 "a tokenizer.json, or bytes (default: the model's or the checkpoint's)");
  app.add_option("--prompt", prompt, "text to continue")->capture_default_str();
  std::string prompt_ids;
  std::vector<int64_t> logits_rows;
  app.add_option("--logits-rows", logits_rows,
                 "with --print-logits: only these rows (positions; negative from the end), for "
                 "a large vocabulary")
      ->delimiter(',');
  app.add_option("--prompt-ids", prompt_ids,
                 "the prompt as token ids (\"2,818,5279\"), no tokenizer needed: the new tokens' "
                 "ids are printed as a JSON list");
  app.add_option(
      "--chat", chat,
      "a user message, rendered by the model's chat template as transformers renders it (the "
      "Jinja engine); stops at the end of the turn");
  app.add_option("--system", system, "with --chat: the system message (default: the template's)");
  std::string chat_template;
  app.add_option("--chat-template", chat_template,
                 "with --chat: a Jinja chat template file in place of the model's own (Gemma 3's "
                 "base GGUF ships none)");
  app.add_option("--tokens", tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", temperature, "sampling temperature (0: greedy)")
      ->capture_default_str();
  app.add_option("--top-k", top_k, "sample among the k likeliest (0: all)")->capture_default_str();
  app.add_option("--top-p", top_p, "then among the likeliest up to this probability (1: all)")
      ->capture_default_str();
  app.add_option("--seed", seed, "sampling seed")->capture_default_str();
  app.add_option("--device", device_name, "cpu or cuda")->capture_default_str();
  app.add_option("--dtype", dtype_name_s,
                 "compute dtype: f32 (CPU; f64 for reference checks), or bf16 / f16 on CUDA")
      ->capture_default_str();
  app.add_option("--threads", threads, "OpenMP threads (0: all cores)")->capture_default_str();
  app.add_flag("--no-kv-cache", no_cache, "recompute the whole window for every token");
  app.add_flag("--ignore-eos", ignore_eos, "go on past the end-of-text token");
  app.add_flag("--print-logits", print_logits,
               "print the prompt's ids and every position's logits as JSON, and exit");
  CLI11_PARSE(app, argc, argv);
  try {
    FSDP_CHECK(model_path.empty() != ckpt.empty(),
               "[fsdp-generate] give exactly one of --model and --ckpt");
    FSDP_CHECK(tokens >= 0 && top_k >= 0 && temperature >= 0,
               "[fsdp-generate] --tokens, --top-k and --temperature must be >= 0");
    FSDP_CHECK(top_p > 0 && top_p <= 1, "[fsdp-generate] --top-p must be in (0, 1], got {}", top_p);
    const Device device = parse_device(device_name);
    FSDP_CHECK(device.is_cpu() || cuda_available(),
               "[fsdp-generate] --device {}: no CUDA device is visible (or fsdp.cpp was built "
               "without CUDA)",
               device_name);
    const DType compute = parse_dtype(dtype_name_s);
    FSDP_CHECK(compute == DType::f32 || (device.is_cpu() && compute == DType::f64) ||
                   (device.is_cuda() && is_floating(compute)),
               "[fsdp-generate] --dtype {} on {}: the CPU computes in f32 (or f64)", dtype_name_s,
               device.str());
    if (threads > 0) omp_set_num_threads(threads);
    Loaded l = model_path.empty() ? load_checkpoint(ckpt, compute, device)
                                  : load_model(model_path, compute, device);
    if (tokenizer_path == "bytes")
      l.tokenizer = data::Tokenizer::bytes();
    else if (!tokenizer_path.empty())
      l.tokenizer = data::Tokenizer::from_file(tokenizer_path);
    else if (!l.tokenizer && !l.pre.tokenizer_unread.empty() && prompt_ids.empty())
      FSDP_FAIL("[fsdp-generate] {}; give --tokenizer FILE.json or --prompt-ids",
                l.pre.tokenizer_unread);
    else if (!l.tokenizer)
      l.tokenizer = data::Tokenizer::bytes();
    const data::Tokenizer& tok = *l.tokenizer;
    FSDP_CHECK(tok.size() <= l.cfg.vocab,
               "[fsdp-generate] the tokenizer ({}) has {} ids but the model's vocab is {}",
               tok.describe(), tok.size(), l.cfg.vocab);
    fmt::print(stderr, "generate: {} {} layers dim {} on {}, {}; tokenizer {}\n",
               nn::arch_name(l.cfg.arch), l.cfg.layers, l.cfg.dim, device.str(), l.what,
               tok.describe());
    // --chat: the model's template around the message; the answer ends at the end of turn.
    std::optional<int32_t> stop = tok.eos_id();
    if (l.pre.eos_id) stop = l.pre.eos_id;
    if (!chat_template.empty()) {
      FSDP_CHECK(chat, "[fsdp-generate] --chat-template needs --chat");
      checkpoint::set_chat_template(l.pre, chat_template);
      l.pre.eot_id = checkpoint::end_of_turn_id(tok, l.pre.chat_template, l.pre.eos_id);
    }
    if (chat) {
      if (l.pre.chat_template.empty())
        FSDP_FAIL(
            "[fsdp-generate] --chat: {} has no chat template (tokenizer_config.json's "
            "chat_template, chat_template.jinja or the GGUF's tokenizer.chat_template)",
            l.what);
      prompt = checkpoint::render_chat(l.pre, tok, *chat, system);
      // The answer ends at the end of turn the template writes (<|im_end|>, <end_of_turn>,
      // <|eot_id|>, named outside its comments), or else at EOS: a marker the tokenizer lacks would
      // come out as text and never stop it.
      const std::string named = data::without_jinja_comments(l.pre.chat_template);
      const auto& vocab = tok.tokens();
      for (const char* end : {"<|im_end|>", "<end_of_turn>", "<|eot_id|>"})
        if (named.find(end) != std::string::npos &&
            std::find(vocab.begin(), vocab.end(), end) == vocab.end())
          FSDP_FAIL(
              "[fsdp-generate] --chat: the chat template ends its turns with {}, but the "
              "tokenizer ({}) has no such token, so the answer would never stop",
              end, tok.describe());
      FSDP_CHECK(l.pre.eot_id.has_value(),
                 "[fsdp-generate] --chat: the tokenizer ({}) has no end-of-turn or EOS token, so "
                 "the answer would never stop",
                 tok.describe());
      stop = l.pre.eot_id;
    } else {
      FSDP_CHECK(!system, "[fsdp-generate] --system needs --chat");
    }
    std::vector<int32_t> ids;
    if (!prompt_ids.empty()) {
      FSDP_CHECK(!chat, "[fsdp-generate] give --chat or --prompt-ids, not both");
      for (size_t at = 0; at <= prompt_ids.size();) {
        const size_t comma = std::min(prompt_ids.find(',', at), prompt_ids.size());
        const std::string item = prompt_ids.substr(at, comma - at);
        size_t used = 0;
        int64_t id = -1;
        try {
          id = std::stoll(item, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        FSDP_CHECK(used == item.size() && !item.empty() && id >= 0 && id < l.cfg.vocab,
                   "[fsdp-generate] --prompt-ids: '{}' is not a token id of the model's vocab "
                   "[0, {})",
                   item, l.cfg.vocab);
        ids.push_back(int32_t(id));
        at = comma + 1;
      }
    } else {
      ids = tok.encode(prompt);
      // The tokenizer's own framing (Gemma's and Llama's BOS), where the text lacks it.
      if (const auto bos = tok.text_prefix_id(); bos && (ids.empty() || ids[0] != *bos))
        ids.insert(ids.begin(), *bos);
    }
    if (print_logits) {
      FSDP_CHECK(!ids.empty(), "[fsdp-generate] --print-logits needs a non-empty prompt");
      Tensor logits =
          l.model->forward(Tensor::from_vector(ids, {1, int64_t(ids.size())}).to(device))
              .to(Device::cpu())
              .to(DType::f64);
      std::vector<int64_t> which;
      for (int64_t r : logits_rows) {
        const int64_t t = r < 0 ? int64_t(ids.size()) + r : r;
        FSDP_CHECK(t >= 0 && t < int64_t(ids.size()),
                   "[fsdp-generate] --logits-rows {} is outside the prompt's {} positions", r,
                   ids.size());
        which.push_back(t);
      }
      if (logits_rows.empty())
        for (size_t t = 0; t < ids.size(); ++t) which.push_back(int64_t(t));
      nlohmann::json rows = nlohmann::json::array();
      for (int64_t t : which) {
        const double* r = logits.data<double>() + size_t(t) * size_t(l.cfg.vocab);
        rows.push_back(std::vector<double>(r, r + l.cfg.vocab));
      }
      fmt::print("{}\n", nlohmann::json({{"ids", ids}, {"rows", which}, {"logits", rows}}).dump());
      return 0;
    }
    const bool as_ids = !prompt_ids.empty();
    std::vector<int32_t> new_ids;
    if (!chat && !as_ids) {  // a chat prints the answer alone
      std::fwrite(prompt.data(), 1, prompt.size(), stdout);
      std::fflush(stdout);
    }
    nn::SampleStats st;
    nn::sample(*l.model, ids,
               {.tokens = tokens,
                .temperature = temperature,
                .top_k = top_k,
                .top_p = top_p,
                .max_id = as_ids ? l.cfg.vocab : tok.size(),
                .seed = seed,
                .device = device,
                .kv_cache = !no_cache,
                .stop_id = ignore_eos ? std::nullopt : stop,
                .on_token =
                    [&](int32_t id) {
                      if (as_ids) {
                        new_ids.push_back(id);
                        return;
                      }
                      const std::string piece = tok.decode({id});
                      std::fwrite(piece.data(), 1, piece.size(), stdout);
                      std::fflush(stdout);
                    }},
               &st);
    if (as_ids) fmt::print("{}", nlohmann::json(new_ids).dump());
    std::fputc('\n', stdout);
    std::fflush(stdout);
    const double decode_rate = double(st.new_tokens) / std::max(st.decode_seconds, 1e-9);
    if (no_cache)
      fmt::print(stderr, "generate: {} new tokens in {:.2f} s ({:.1f} tokens/s), no KV cache\n",
                 st.new_tokens, st.decode_seconds, decode_rate);
    else
      fmt::print(stderr,
                 "generate: prompt {} tokens in {:.1f} ms ({:.0f} tokens/s), {} new tokens in "
                 "{:.2f} s ({:.1f} tokens/s)\n",
                 st.prompt_tokens, 1e3 * st.prefill_seconds,
                 double(st.prompt_tokens) / std::max(st.prefill_seconds, 1e-9), st.new_tokens,
                 st.decode_seconds, decode_rate);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fsdp-generate: error: {}\n", without_source_place(e.what()));
    return 1;
  }
}
