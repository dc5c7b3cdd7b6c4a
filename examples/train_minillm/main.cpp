// fsdp-train: trains the MiniLLM. The C++ form of the reference PyTorch
// script (../shared/seed/train_fsdp.py): the same model, the same defaults
// (AdamW lr 3e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, random
// tokens, batch 8 x 1024) and the same per-step line, plus tokens/s and MFU:
//   step 3 | loss 7.1234 | 1234 tok/s | mfu 41.2% | peak mem 0.52 GB
// With --data FILE it trains on the file's bytes and prints a sample at the end.
// This binary is the only place that catches fsdp::Error: it prints the
// message and exits non-zero.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <thread>

#include "fsdp/core/allocator.h"
#include "fsdp/data/text_dataset.h"
#include "fsdp/nn/init.h"
#include "fsdp/nn/minillm.h"
#include "fsdp/ops/ops.h"
#include "fsdp/ops/peak.h"
#include "fsdp/optim/adamw.h"

namespace {

using namespace fsdp;

struct Options {
  std::string preset = "tiny";
  std::optional<std::string> arch;
  std::optional<int64_t> vocab, dim, layers, heads, seq, batch, ffn_hidden;
  int64_t steps = 5;
  double lr = 3e-4, weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  uint64_t seed = 1337;
  std::string dtype = "f32";
  int threads = 0;
  std::string data;
  int64_t sample_tokens = 200;
  std::string prompt = "The ";
  double temperature = 0.8;
};

void print_config(const nn::MiniLLMConfig& c, const Options& o, int64_t nparams, DType dtype, int threads,
                  const data::TokenSource& src, double peak) {
  auto row = [](const std::string& k, const std::string& v) { fmt::print("| {:<22} | {:<44} |\n", k, v); };
  fmt::print("+{:-<24}+{:-<46}+\n", "", "");
  row("preset / arch", fmt::format("{} / {}", o.preset, nn::arch_name(c.arch)));
  row("vocab / dim / layers", fmt::format("{} / {} / {}", c.vocab, c.dim, c.layers));
  row("heads / ffn hidden", fmt::format("{} / {}", c.heads, c.resolved_ffn_hidden()));
  row("seq x batch", fmt::format("{} x {} = {} tokens/step", c.seq, c.batch, c.seq * c.batch));
  row("parameters", fmt::format("{} ({:.2f} M)", nparams, double(nparams) / 1e6));
  row("dtype", std::string(dtype_name(dtype)));
  row("optimizer", fmt::format("AdamW lr {:g} betas ({:g}, {:g}) wd {:g}", o.lr, o.beta1, o.beta2, o.weight_decay));
  row("steps / seed", fmt::format("{} / {}", o.steps, o.seed));
  row("data", src.describe());
  row("world size", "1 (cpu)");
  row("threads", std::to_string(threads));
  row("sgemm peak", fmt::format("{:.1f} GFLOP/s (MFU denominator)", peak / 1e9));
  row("FLOPs / token", fmt::format("{:.3g}", c.flops_per_token()));
  fmt::print("+{:-<24}+{:-<46}+\n", "", "");
}

// Samples `n` bytes after `prompt` with temperature sampling, recomputing the
// whole window each token (the model has no KV cache yet).
std::string sample(nn::MiniLLM& model, const std::string& prompt, int64_t n, double temperature, uint64_t seed) {
  const auto& c = model.config();
  std::vector<int32_t> ctx;
  for (unsigned char ch : prompt) ctx.push_back(int32_t(ch) % int32_t(c.vocab));
  if (ctx.empty()) ctx.push_back(int32_t(' '));
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = std::min<int64_t>(int64_t(ctx.size()), c.seq);
    std::vector<int32_t> window(ctx.end() - len, ctx.end());
    Tensor logits = model.forward(Tensor::from_vector(window, {1, len})).to(DType::f64);
    const double* last = logits.data<double>() + (len - 1) * c.vocab;
    double m = -1e300;
    for (int64_t v = 0; v < 256 && v < c.vocab; ++v) m = std::max(m, last[v]);
    std::vector<double> p(size_t(std::min<int64_t>(256, c.vocab)));
    double sum = 0;
    for (size_t v = 0; v < p.size(); ++v) sum += p[v] = std::exp((last[v] - m) / temperature);
    double u = nn::counter_uniform(seed, uint64_t(i)) * sum;
    size_t pick = 0;
    for (; pick + 1 < p.size() && u > p[pick]; ++pick) u -= p[pick];
    ctx.push_back(int32_t(pick));
    out.push_back(char(pick));
  }
  return out;
}

int run(const Options& o) {
  nn::MiniLLMConfig cfg = nn::MiniLLMConfig::preset(o.preset);
  if (o.arch) cfg.arch = nn::parse_arch(*o.arch);
  if (o.vocab) cfg.vocab = *o.vocab;
  if (o.dim) cfg.dim = *o.dim;
  if (o.layers) cfg.layers = *o.layers;
  if (o.heads) cfg.heads = *o.heads;
  if (o.seq) cfg.seq = *o.seq;
  if (o.batch) cfg.batch = *o.batch;
  if (o.ffn_hidden) cfg.ffn_hidden = *o.ffn_hidden;
  cfg.validate();
  FSDP_CHECK(o.steps >= 0, "[fsdp-train] --steps must be >= 0, got {}", o.steps);
  FSDP_CHECK(o.lr >= 0 && std::isfinite(o.lr), "[fsdp-train] --lr must be a finite number >= 0, got {}", o.lr);
  FSDP_CHECK(o.threads >= 0, "[fsdp-train] --threads must be >= 0 (0 = all cores), got {}", o.threads);
  const DType dtype = parse_dtype(o.dtype);
  FSDP_CHECK(dtype == DType::f32 || dtype == DType::f64,
             "[fsdp-train] --dtype {} is not a CPU training dtype; use f32 or f64 (bf16 parameters come with "
             "fully_shard's MixedPrecisionPolicy)",
             o.dtype);

  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(threads);

  std::unique_ptr<data::TokenSource> src;
  if (!o.data.empty()) {
    src = std::make_unique<data::ByteTextSource>(o.data, cfg.vocab, cfg.seq);
    if (cfg.arch == nn::Arch::seed)
      fmt::print(stderr,
                 "warning: arch seed attends in both directions with no mask, so on text it sees the next token "
                 "it must predict; use --arch llama to learn a language model\n");
  } else {
    src = std::make_unique<data::RandomTokenSource>(cfg.vocab, o.seed);
  }

  nn::MiniLLM model(cfg);
  nn::FlatParameters flat = nn::materialize(model, dtype, o.seed);
  optim::AdamW opt({{flat.params, flat.grads, o.weight_decay}},
                   {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay});
  const double peak = ops::sgemm_peak_flops(threads);
  print_config(cfg, o, model.num_parameters(), dtype, threads, *src, peak);
  std::fflush(stdout);

  const int64_t tokens_per_step = cfg.batch * cfg.seq;
  for (int64_t step = 0; step < o.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    data::Batch b = src->batch(step, cfg.batch, 0, cfg.batch, cfg.seq);
    flat.grads.zero_();
    Tensor logits = model.forward(b.inputs).view({tokens_per_step, cfg.vocab});
    auto xent = ops::cross_entropy_forward(logits, b.targets);
    Tensor dlogits = ops::cross_entropy_backward(logits, b.targets, xent.lse, 1.0);
    logits = Tensor();
    model.backward(dlogits.view({cfg.batch, cfg.seq, cfg.vocab}));
    opt.step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    FSDP_CHECK(std::isfinite(xent.loss), "[fsdp-train] loss became {} at step {}; lower --lr", xent.loss, step);
    const double tok_s = double(tokens_per_step) / dt;
    const double mfu = cfg.flops_per_token() * tok_s / peak;
    fmt::print("step {} | loss {:.4f} | {:.0f} tok/s | mfu {:.1f}% | peak mem {:.2f} GB\n", step, xent.loss, tok_s,
               100.0 * mfu, double(memory_stats().peak) / 1e9);
    std::fflush(stdout);
  }

  if (!o.data.empty() && o.sample_tokens > 0) {
    std::string text = sample(model, o.prompt, o.sample_tokens, o.temperature, o.seed);
    for (char& ch : text)
      if ((unsigned char)ch < 32 && ch != '\n') ch = ' ';
    fmt::print("sample: {}{}\n", o.prompt, text);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"fsdp-train: train the MiniLLM (the C++ form of the reference FSDP2 script)", "fsdp-train"};
  app.get_formatter()->column_width(34);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides an earlier one
  app.add_option("--preset", o.preset, "model and batch preset: seed (the reference size) or tiny")
      ->capture_default_str();
  app.add_option("--arch", o.arch, "architecture: seed (reference MiniLLM) or llama (causal, RoPE, SwiGLU)");
  app.add_option("--vocab", o.vocab, "vocabulary size (overrides the preset)");
  app.add_option("--dim", o.dim, "model width (overrides the preset)");
  app.add_option("--layers", o.layers, "transformer blocks (overrides the preset)");
  app.add_option("--heads", o.heads, "attention heads (overrides the preset)");
  app.add_option("--seq", o.seq, "sequence length (overrides the preset)");
  app.add_option("--batch", o.batch, "sequences per step (overrides the preset)");
  app.add_option("--ffn-hidden", o.ffn_hidden, "FFN hidden size (0: 4*dim for seed, 8/3*dim rounded for llama)");
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  app.add_option("--beta1", o.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", o.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--eps", o.eps, "AdamW eps")->capture_default_str();
  app.add_option("--seed", o.seed, "seed for initialisation and random tokens")->capture_default_str();
  app.add_option("--dtype", o.dtype, "parameter and compute dtype on CPU: f32 or f64")->capture_default_str();
  app.add_option("--threads", o.threads, "OpenMP threads for BLAS and kernels (0: all cores)")->capture_default_str();
  app.add_option("--data", o.data, "train on this file's bytes (vocab >= 256); default: random tokens");
  app.add_option("--sample-tokens", o.sample_tokens, "bytes to sample after training on --data")
      ->capture_default_str();
  app.add_option("--prompt", o.prompt, "prompt for the sample")->capture_default_str();
  app.add_option("--temperature", o.temperature, "sampling temperature")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    fmt::print(stderr, "fsdp-train: error: {}\nRun with --help for the flags.\n", e.what());
    return 2;
  }
  try {
    return run(o);
  } catch (const fsdp::Error& e) {
    fmt::print(stderr, "fsdp-train: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fsdp-train: error: {}\n", e.what());
    return 1;
  }
}
