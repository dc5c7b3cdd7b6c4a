// fsdp-export: a sharded checkpoint -> one consolidated file for other tools.
//   fsdp-export --ckpt D [--out model.safetensors] [--dtype f32|bf16|f16]
//       the seed architecture keeps PyTorch's state_dict names; the llama
//       architecture takes Hugging Face's LlamaForCausalLM names and gets a
//       config.json beside the file (--names ours keeps ours)
//   fsdp-export --ckpt D --gguf model.gguf [--dtype ...]   GGUF v3 for llama.cpp
//   fsdp-export --ckpt D --peft DIR    a LoRA run's adapter alone, in PEFT's format
//   fsdp-export --ckpt D --gguf-lora adapter.gguf   the same for llama.cpp's --lora
// A LoRA checkpoint holds the adapters only: --out and --gguf write its base (the run's
// --init-from, checked by content) with the adapters merged into it.
// D is a checkpoint directory (step_NNNNNNNN) or a --ckpt-dir, whose newest is taken.
// The tokenizer is the checkpoint's (fsdp-train saves it; bytes for older checkpoints) or
// --tokenizer's: tokenizer.json and its config files go beside a Hugging Face export, and a
// "gpt2" vocabulary into the GGUF. A run started from a pretrained model (--init-from) saved the
// model's special ids, chat template and pre-tokenizer name (tokenizer_meta.json), which go
// into tokenizer_config.json, generation_config.json and the GGUF's tokenizer keys.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <compare>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/data/tokenizer.h"

int main(int argc, char** argv) {
  using namespace fsdp;
  std::string ckpt, out, gguf, peft, gguf_lora, dtype_s = "f32", names = "auto", tokenizer;
  CLI::App app{"fsdp-export: consolidate a sharded checkpoint into safetensors or GGUF",
               "fsdp-export"};
  app.add_option("--ckpt", ckpt, "checkpoint directory, or a --ckpt-dir (its newest checkpoint)")
      ->required();
  app.add_option("--out", out, "safetensors file to write");
  app.add_option("--gguf", gguf, "GGUF v3 file to write (llama architecture)");
  app.add_option("--peft", peft,
                 "folder for a LoRA run's adapter in PEFT's format (adapter_model.safetensors, "
                 "adapter_config.json)");
  app.add_option("--gguf-lora", gguf_lora,
                 "GGUF LoRA adapter for llama.cpp's --lora (a LoRA run's adapter alone)");
  app.add_option("--dtype", dtype_s, "tensor dtype: f32, bf16 or f16")->capture_default_str();
  app.add_option("--names", names,
                 "safetensors names: auto (PyTorch for seed, Hugging Face for llama) or ours")
      ->capture_default_str();
  app.add_option("--tokenizer", tokenizer,
                 "a tokenizer.json, or bytes (default: the one saved in the checkpoint)");
  CLI11_PARSE(app, argc, argv);
  try {
    FSDP_CHECK(!out.empty() || !gguf.empty() || !peft.empty() || !gguf_lora.empty(),
               "[fsdp-export] give --out FILE.safetensors, --gguf FILE.gguf, --peft DIR or "
               "--gguf-lora FILE.gguf");
    FSDP_CHECK(names == "auto" || names == "ours",
               "[fsdp-export] --names must be auto or ours, got '{}'", names);
    const DType dtype = parse_dtype(dtype_s);
    FSDP_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
               "[fsdp-export] --dtype must be f32, bf16 or f16, got {}", dtype_s);
    std::string path = ckpt;
    if (!std::filesystem::exists(std::filesystem::path(ckpt) / "metadata.json")) {
      path = checkpoint::latest(ckpt);
      // Newer step folders that are not complete are skipped aloud, as a resume skips them.
      std::vector<std::filesystem::path> newer;
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(ckpt, ec))
        if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0 &&
            e.path().filename() > std::filesystem::path(path).filename())
          newer.push_back(e.path());
      std::sort(newer.begin(), newer.end());
      for (const auto& d : newer)
        fmt::print(stderr, "export: skipping {}: {}\n", d.string(),
                   checkpoint::incomplete_reason(d.string()));
      FSDP_CHECK(!path.empty(), "[fsdp-export] no complete checkpoint in '{}'", ckpt);
    }
    fmt::print("export: reading {}\n", path);
    for (const std::string& f : {out, gguf})
      if (!f.empty() && std::filesystem::path(f).has_parent_path())
        std::filesystem::create_directories(std::filesystem::path(f).parent_path());
    if (!peft.empty() || !gguf_lora.empty()) {  // the adapters alone, before any base is merged
      nn::TransformerConfig lora_cfg;
      const auto adapters = checkpoint::consolidate(path, &lora_cfg, false);
      if (!peft.empty()) {
        auto named = checkpoint::to_peft(lora_cfg, adapters);
        for (auto& [n, t] : named) t = t.contiguous().to(dtype);
        std::filesystem::create_directories(peft);
        checkpoint::save_safetensors(
            (std::filesystem::path(peft) / "adapter_model.safetensors").string(), named,
            {{"format", "pt"}});
        write_file_atomic(
            (std::filesystem::path(peft) / "adapter_config.json").string(),
            checkpoint::peft_adapter_config_json(lora_cfg, checkpoint::lora_base_path(path)) + "\n",
            "[fsdp-export]");
        fmt::print("export: wrote {} (PEFT LoRA adapter: {} tensors, rank {}, alpha {})\n", peft,
                   named.size(), lora_cfg.lora.rank, lora_cfg.lora.alpha);
      }
      if (!gguf_lora.empty()) {
        if (std::filesystem::path(gguf_lora).has_parent_path())
          std::filesystem::create_directories(std::filesystem::path(gguf_lora).parent_path());
        checkpoint::write_gguf_lora(gguf_lora, lora_cfg, adapters);
        fmt::print(
            "export: wrote {} (GGUF LoRA adapter for llama.cpp's --lora, rank {}, alpha {})\n",
            gguf_lora, lora_cfg.lora.rank, lora_cfg.lora.alpha);
      }
      if (out.empty() && gguf.empty()) return 0;
    }
    nn::TransformerConfig cfg;
    auto tensors = checkpoint::consolidate(path, &cfg);
    std::optional<data::Tokenizer> tok;
    checkpoint::TokenizerMeta meta;
    if (tokenizer == "bytes") {
      tok = data::Tokenizer::bytes();
    } else if (!tokenizer.empty()) {
      tok = data::Tokenizer::from_file(tokenizer);
    } else if (auto saved = checkpoint::read_extra_file(path, "tokenizer.json")) {
      tok = data::Tokenizer::from_json(*saved, path + "/tokenizer.json");
      // A fine-tuned pretrained model's: its own ids, chat template and pre-tokenizer name.
      if (auto m = checkpoint::read_extra_file(path, "tokenizer_meta.json"))
        meta = checkpoint::TokenizerMeta::from_json(*m, path + "/tokenizer_meta.json");
    } else if (cfg.vocab >= 256) {
      tok = data::Tokenizer::bytes();
      fmt::print("export: {} saved no tokenizer; writing the byte vocabulary\n", path);
    } else {
      fmt::print(
          "export: {} saved no tokenizer and its vocab {} holds no bytes: no tokenizer "
          "written (--tokenizer names one)\n",
          path, cfg.vocab);
    }
    if (tok) {
      FSDP_CHECK(tok->size() <= cfg.vocab,
                 "[fsdp-export] the tokenizer ({}) has {} ids but the model's vocab is {}",
                 tok->describe(), tok->size(), cfg.vocab);
      fmt::print("export: tokenizer {}\n", tok->describe());
    }
    FSDP_CHECK(gguf.empty() || tok,
               "[fsdp-export] --gguf needs a tokenizer: the checkpoint saved none and its vocab "
               "{} holds no bytes; pass --tokenizer FILE",
               cfg.vocab);
    fmt::print("export: {} tensors, {} {} layers dim {}\n", tensors.size(), nn::arch_name(cfg.arch),
               cfg.layers, cfg.dim);
    if (!out.empty()) {
      auto named = cfg.arch == nn::Arch::decoder && names == "auto"
                       ? checkpoint::to_hf(cfg, tensors)
                       : tensors;
      for (auto& [n, t] : named) t = t.contiguous().to(dtype);
      checkpoint::save_safetensors(out, named, {{"format", "pt"}, {"fsdp.config", cfg.to_json()}});
      fmt::print("export: wrote {} ({} tensors, {})\n", out, named.size(), dtype_name(dtype));
      if (cfg.arch == nn::Arch::decoder && names == "auto") {
        const auto dir = std::filesystem::path(out).parent_path();
        std::vector<std::pair<std::string, std::string>> files = {
            {"config.json",
             checkpoint::hf_config_json(cfg, dtype, tok ? *tok : data::Tokenizer::bytes(), meta)}};
        if (tok)
          for (auto& f : checkpoint::hf_tokenizer_files(cfg, *tok, meta)) files.push_back(f);
        // Each checked to its close, fsynced; the JSON files end with a newline, the template
        // is written as it came.
        for (const auto& [name, text] : files)
          write_file_atomic((dir / name).string(), name.ends_with(".json") ? text + "\n" : text,
                            "[fsdp-export]");
        std::string names_written;
        for (const auto& f : files) names_written += (names_written.empty() ? "" : ", ") + f.first;
        fmt::print("export: wrote {} beside it\n", names_written);
      } else if (tok) {
        const auto tj = std::filesystem::path(out).parent_path() / "tokenizer.json";
        write_file_atomic(tj.string(), tok->json() + "\n", "[fsdp-export]");
        fmt::print("export: wrote {}\n", tj.string());
      }
    }
    if (!gguf.empty()) {
      checkpoint::write_gguf(gguf, cfg, tensors, dtype, *tok, meta);
      fmt::print("export: wrote {} (GGUF v3, {})\n", gguf, dtype_name(dtype));
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fsdp-export: error: {}\n", fsdp::without_source_place(e.what()));
    return 1;
  }
}
