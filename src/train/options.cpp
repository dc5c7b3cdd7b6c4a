// TrainOptions (fsdp/train/options.h): reading and printing flag values, set_flag, the model
// config and the one validation of the options.
#include "fsdp/train/options.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include "fsdp/core/error.h"
#include "fsdp/models/spec.h"
#include "fsdp/train/preference.h"
#include "src/core/json_read.h"

namespace fsdp::train {

namespace {

template <class Int>
Int parse_integer(std::string_view flag, std::string_view text, const char* what) {
  Int v{};
  const char* e = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), e, v);
  FSDP_CHECK(ec == std::errc() && p == e && !text.empty(), "[fsdp-train] {} takes {}, got '{}'{}",
             flag, what, text, ec == std::errc::result_out_of_range ? " (out of range)" : "");
  return v;
}

// An enum's flag names: "{a, b or c}" in errors, in the order of the table.
template <class E, size_t N>
E parse_choice(std::string_view flag, std::string_view text,
               const std::array<std::pair<std::string_view, E>, N>& names) {
  for (const auto& [name, value] : names)
    if (text == name) return value;
  std::string expected;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) expected += i + 1 < N ? ", " : " or ";
    expected += names[i].first;
  }
  FSDP_FAIL("[fsdp-train] {} must be {}, got '{}'", flag, expected, text);
}

template <class E, size_t N>
std::string choice_name(E v, const std::array<std::pair<std::string_view, E>, N>& names) {
  for (const auto& [name, value] : names)
    if (v == value) return std::string(name);
  return "?";
}

constexpr std::array<std::pair<std::string_view, ShardMode>, 2> kShardModes{
    {{"full", ShardMode::full}, {"none", ShardMode::none}}};
constexpr std::array<std::pair<std::string_view, optim::Decay>, 3> kDecays{
    {{"none", optim::Decay::constant},
     {"cosine", optim::Decay::cosine},
     {"linear", optim::Decay::linear}}};

// Another library's parser, its error prefixed with the flag.
template <class Parse>
auto parse_with(std::string_view flag, Parse&& parse) {
  try {
    return parse();
  } catch (const Error& e) {
    // Without its place in the source: this one's follows.
    FSDP_FAIL("[fsdp-train] {}: {}", flag, without_source_place(e.what()));
  }
}

}  // namespace

bool FlagValue<bool>::parse(std::string_view flag, std::string_view text) {
  std::string t(text);  // any case, as CLI11 reads a switch's value
  for (char& c : t) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return false;
  FSDP_FAIL("[fsdp-train] {} takes true or false, got '{}'", flag, text);
}
std::string FlagValue<bool>::str(const bool& v) { return v ? "true" : "false"; }
const char* FlagValue<bool>::type_name() { return "BOOL"; }

int FlagValue<int>::parse(std::string_view flag, std::string_view text) {
  return parse_integer<int>(flag, text, "an integer");
}
std::string FlagValue<int>::str(const int& v) { return std::to_string(v); }
const char* FlagValue<int>::type_name() { return "INT"; }

int64_t FlagValue<int64_t>::parse(std::string_view flag, std::string_view text) {
  return parse_integer<int64_t>(flag, text, "an integer");
}
std::string FlagValue<int64_t>::str(const int64_t& v) { return std::to_string(v); }
const char* FlagValue<int64_t>::type_name() { return "INT"; }

uint64_t FlagValue<uint64_t>::parse(std::string_view flag, std::string_view text) {
  return parse_integer<uint64_t>(flag, text, "an integer >= 0");
}
std::string FlagValue<uint64_t>::str(const uint64_t& v) { return std::to_string(v); }
const char* FlagValue<uint64_t>::type_name() { return "UINT"; }

double FlagValue<double>::parse(std::string_view flag, std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  FSDP_CHECK(!s.empty() && end == s.c_str() + s.size() && !(errno == ERANGE && std::isinf(v)),
             "[fsdp-train] {} takes a number, got '{}'", flag, text);
  return v;
}
std::string FlagValue<double>::str(const double& v) { return fmt::format("{}", v); }
const char* FlagValue<double>::type_name() { return "FLOAT"; }

std::string FlagValue<std::string>::parse(std::string_view, std::string_view text) {
  return std::string(text);
}
std::string FlagValue<std::string>::str(const std::string& v) { return v; }
const char* FlagValue<std::string>::type_name() { return "TEXT"; }

DType FlagValue<DType>::parse(std::string_view flag, std::string_view text) {
  return parse_with(flag, [&] { return parse_dtype(text); });
}
std::string FlagValue<DType>::str(const DType& v) { return std::string(dtype_name(v)); }
const char* FlagValue<DType>::type_name() { return "DTYPE"; }

Device FlagValue<Device>::parse(std::string_view flag, std::string_view text) {
  return parse_with(flag, [&] { return parse_device(text); });
}
std::string FlagValue<Device>::str(const Device& v) { return v.str(); }
const char* FlagValue<Device>::type_name() { return "DEVICE"; }

// --arch: the module tree's form, by the name of the family that is it (nn::arch_name); the other
// families of a form are its options, or an --init-from model's config.
nn::Arch FlagValue<nn::Arch>::parse(std::string_view flag, std::string_view text) {
  std::string names;
  for (const models::ModelSpec* s : models::model_specs()) {
    if (s->name != nn::arch_name(s->arch)) continue;
    if (text == s->name) return s->arch;
    names += fmt::format("{}{}", names.empty() ? "" : " or ", s->name);
  }
  FSDP_FAIL("[fsdp-train] {} must be {}, got '{}'", flag, names, text);
}
std::string FlagValue<nn::Arch>::str(const nn::Arch& v) { return nn::arch_name(v); }
const char* FlagValue<nn::Arch>::type_name() { return "ARCH"; }

optim::Decay FlagValue<optim::Decay>::parse(std::string_view flag, std::string_view text) {
  return parse_choice(flag, text, kDecays);
}
std::string FlagValue<optim::Decay>::str(const optim::Decay& v) { return choice_name(v, kDecays); }
const char* FlagValue<optim::Decay>::type_name() { return "{none,cosine,linear}"; }

ShardMode FlagValue<ShardMode>::parse(std::string_view flag, std::string_view text) {
  return parse_choice(flag, text, kShardModes);
}
std::string FlagValue<ShardMode>::str(const ShardMode& v) { return choice_name(v, kShardModes); }
const char* FlagValue<ShardMode>::type_name() { return "{full,none}"; }

ActivationCheckpoint FlagValue<ActivationCheckpoint>::parse(std::string_view flag,
                                                            std::string_view text) {
  if (text == "none") return {0};
  if (text == "full") return {1};
  int64_t n = 0;
  const std::string_view count = text.starts_with("every:") ? text.substr(6) : std::string_view();
  const char* e = count.data() + count.size();
  const auto [p, ec] = std::from_chars(count.data(), e, n);
  const bool parsed = !count.empty() && ec == std::errc() && p == e && n >= 1;
  FSDP_CHECK(parsed, "[fsdp-train] {} must be none, full or every:N (N >= 1), got '{}'", flag,
             text);
  return {n};
}
std::string FlagValue<ActivationCheckpoint>::str(const ActivationCheckpoint& v) {
  return v.every == 0 ? "none" : v.every == 1 ? "full" : fmt::format("every:{}", v.every);
}
const char* FlagValue<ActivationCheckpoint>::type_name() { return "MODE"; }

StepRange FlagValue<StepRange>::parse(std::string_view flag, std::string_view text) {
  const size_t colon = text.find(':');
  StepRange r;
  auto number = [](std::string_view s, int64_t& v) {
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc() && p == s.data() + s.size();
  };
  const bool parsed = colon != std::string_view::npos && number(text.substr(0, colon), r.begin) &&
                      number(text.substr(colon + 1), r.end);
  FSDP_CHECK(parsed, "[fsdp-train] {} '{}' must be A:B, the steps [A, B) to profile", flag, text);
  FSDP_CHECK(r.begin >= 0 && r.end > r.begin, "[fsdp-train] {} '{}': need 0 <= A < B", flag, text);
  return r;
}
std::string FlagValue<StepRange>::str(const StepRange& v) {
  return v.empty() ? "" : fmt::format("{}:{}", v.begin, v.end);
}
const char* FlagValue<StepRange>::type_name() { return "A:B"; }

std::string FlagInfo::name() const {
  std::string n = "--" + std::string(field);
  for (char& c : n)
    if (c == '_') c = '-';
  return n;
}

void set_flag(TrainOptions& o, std::string_view flag, std::string_view text) {
  bool found = false;
  visit_flags(o, [&](const FlagInfo& info, auto& field) {
    using T = std::remove_cvref_t<decltype(field)>;
    const std::string name = info.name();
    bool match = name == flag;
    for (size_t b = 0; !match && b < info.aliases.size();) {  // comma-separated aliases
      const size_t e = std::min(info.aliases.find(',', b), info.aliases.size());
      match = info.aliases.substr(b, e - b) == flag;
      b = e + 1;
    }
    if (!match) return;
    field = FlagValue<T>::parse(name, text);
    found = true;
  });
  FSDP_CHECK(found, "[fsdp-train] no flag named '{}' (fsdp-train --help lists them)", flag);
}

std::string flags_json(const TrainOptions& o) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  visit_flags(o, [&](const FlagInfo& info, const auto& field) {
    // a path or a prompt that is not UTF-8 is written escaped (\xNN): JSON holds only UTF-8
    j[info.name()] =
        json_read::utf8_safe(FlagValue<std::remove_cvref_t<decltype(field)>>::str(field));
  });
  return j.dump();
}

nn::TransformerConfig TrainOptions::model_config() const {
  const ModelOptions& m = model;
  nn::TransformerConfig cfg = nn::TransformerConfig::preset(m.preset);
  if (m.arch) cfg.arch = *m.arch;
  if (m.vocab) cfg.vocab = *m.vocab;
  if (m.dim) cfg.dim = *m.dim;
  if (m.layers) cfg.layers = *m.layers;
  if (m.heads) cfg.heads = *m.heads;
  if (m.seq) cfg.seq = *m.seq;
  if (m.batch) cfg.batch = *m.batch;
  if (m.ffn_hidden) cfg.ffn_hidden = *m.ffn_hidden;
  if (m.kv_heads) cfg.kv_heads = *m.kv_heads;
  if (m.head_dim) cfg.head_dim = *m.head_dim;
  if (m.rope_theta) cfg.rope_theta = *m.rope_theta;
  if (m.tie_embeddings) cfg.tie_embeddings = true;
  if (m.qkv_bias) cfg.qkv_bias = true;
  if (m.qk_norm) cfg.qk_norm = true;
  if (m.norm_plus_one) cfg.norm_plus_one = true;
  if (m.sandwich_norms) cfg.sandwich_norms = true;
  if (m.geglu) cfg.geglu = true;
  if (m.embed_scale) cfg.embed_scale = true;
  if (m.sliding_window) cfg.sliding_window = *m.sliding_window;
  if (m.global_every) cfg.global_every = *m.global_every;
  if (m.rope_local_theta) cfg.rope_local_theta = *m.rope_local_theta;
  cfg.lora = lora_config(cfg.arch, cfg.moe.enabled());
  cfg.validate();
  return cfg;
}

nn::LoraConfig TrainOptions::lora_config(nn::Arch arch, bool moe) const {
  const ModelOptions& m = model;
  FSDP_CHECK(m.lora_rank >= 0, "[fsdp-train] --lora-rank must be >= 0 (0: no LoRA), got {}",
             m.lora_rank);
  FSDP_CHECK(m.lora_rank > 0 || !m.lora_alpha, "[fsdp-train] --lora-alpha {} needs --lora-rank",
             m.lora_alpha.value_or(0));
  if (m.lora_rank == 0) return {};
  const double alpha = m.lora_alpha.value_or(double(m.lora_rank));
  FSDP_CHECK(alpha > 0 && std::isfinite(alpha),
             "[fsdp-train] --lora-alpha must be a positive number, got {}", alpha);
  const char* all = moe ? "q,k,v,o" : "q,k,v,o,gate,up,down";  // an MoE's experts stay frozen
  uint32_t targets = nn::parse_lora_targets(m.lora_targets == "all" ? all : m.lora_targets);
  if (m.lora_targets == "all" && arch == nn::Arch::seed) targets &= ~uint32_t(nn::LoraTarget::gate);
  return {.rank = m.lora_rank, .alpha = alpha, .targets = targets};
}

void TrainOptions::validate() const {
  const OptimizerOptions& op = optimizer;
  const ScheduleOptions& sc = schedule;
  const ShardingOptions& sh = sharding;
  const CheckpointOptions& ck = checkpoint;
  const bool full = sh.shard == ShardMode::full;
  FSDP_CHECK(sc.steps >= 0, "[fsdp-train] --steps must be >= 0, got {}", sc.steps);
  FSDP_CHECK(data.chat_template.empty() || !model.init_from.empty(),
             "[fsdp-train] --chat-template {} needs --init-from: the pretrained model whose "
             "tokenizer renders the chats",
             data.chat_template);
  FSDP_CHECK(op.lr >= 0 && std::isfinite(op.lr),
             "[fsdp-train] --lr must be a finite number >= 0, got {}", op.lr);
  FSDP_CHECK(run.threads >= 0,
             "[fsdp-train] --threads must be >= 0 (0 = this rank's share of the cores), got {}",
             run.threads);
  FSDP_CHECK(run.backend.empty() || run.backend == "nccl" || run.backend == "mpi" ||
                 run.backend == "gloo" || run.backend == "local",
             "[fsdp-train] --backend must be nccl, mpi, gloo or local, got '{}'", run.backend);
  FSDP_CHECK(sh.grad_accum >= 1, "[fsdp-train] --grad-accum must be >= 1, got {}", sh.grad_accum);
  const PreferenceOptions& pr = preference;
  FSDP_CHECK(pr.pref_reference.empty() || pr.preference == "dpo" || pr.preference == "ipo",
             "[fsdp-train] --pref-reference {} is the reference model of --preference dpo or ipo "
             "(given: '{}')",
             pr.pref_reference, pr.preference);
  FSDP_CHECK(pr.pref_truncation == "keep_start" || pr.pref_truncation == "keep_end",
             "[fsdp-train] --pref-truncation must be keep_start or keep_end, got '{}'",
             pr.pref_truncation);
  FSDP_CHECK(!pr.pref_precompute_ref || pr.preference == "dpo" || pr.preference == "ipo",
             "[fsdp-train] --pref-precompute-ref computes the reference log-probs of --preference "
             "dpo or ipo (given: '{}')",
             pr.preference);
  FSDP_CHECK(pr.pref_ref_cache.empty() || pr.pref_precompute_ref,
             "[fsdp-train] --pref-ref-cache {} is the file of --pref-precompute-ref; give both",
             pr.pref_ref_cache);
  if (!pr.preference.empty()) {
    const PreferenceKind kind = parse_preference_kind(pr.preference);
    FSDP_CHECK(kind == PreferenceKind::simpo || kind == PreferenceKind::orpo ||
                   (model.lora_rank > 0 && pr.pref_reference.empty()) ||
                   (pr.pref_precompute_ref && pr.pref_reference.empty()) || full,
               "[fsdp-train] --preference {} with --pref-reference or without --lora-rank keeps a "
               "frozen sharded model as the reference, which needs --shard full (replicate() "
               "takes no frozen parameters), or --pref-precompute-ref without --pref-reference (the "
               "initial model's log-probs computed before training)",
               pr.preference);
    FSDP_CHECK(!data.data.empty(), "[fsdp-train] --preference {} trains on pairs: give --data "
               "FILE.jsonl of {{\"prompt\", \"chosen\", \"rejected\"}}", pr.preference);
    FSDP_CHECK(!data.pack, "[fsdp-train] --pack with --preference: each pair's rows are one "
               "sequence each, not packed");
  }
  FSDP_CHECK(model.lora_rank == 0 || full,
             "[fsdp-train] --lora-rank {} needs --shard full: the frozen base is kept apart from "
             "the adapters by fully_shard (replicate steps one flat buffer of every parameter)",
             model.lora_rank);
  FSDP_CHECK(model.base_quant == "dequantize" || model.base_quant == "keep",
             "[fsdp-train] --base-quant must be keep or dequantize, got '{}'", model.base_quant);
  FSDP_CHECK(model.base_quant != "keep" || (model.lora_rank > 0 && !model.init_from.empty()),
             "[fsdp-train] --base-quant keep needs --lora-rank and a GGUF --init-from: it keeps a "
             "frozen base's quantized blocks");
  FSDP_CHECK(model.base_quant != "keep" || run.device.is_cpu(),
             "[fsdp-train] --base-quant keep dequantizes on the CPU only, not on {}",
             run.device.str());
  FSDP_CHECK(op.grad_clip >= 0, "[fsdp-train] --clip must be >= 0 (0 = off), got {}", op.grad_clip);
  FSDP_CHECK(sh.dtype == DType::f32 || sh.dtype == DType::f64 ||
                 (model.lora_rank > 0 && (sh.dtype == DType::bf16 || sh.dtype == DType::f16)),
             "[fsdp-train] --dtype {} is not a CPU training dtype; use f32 or f64 for the (master) "
             "parameters and --param-dtype bf16 for bf16 compute (with --lora-rank, bf16 or f16 "
             "is the frozen base's dtype, beside f32 adapters)",
             dtype_name(sh.dtype));
  FSDP_CHECK(full || (!sh.param_dtype && !sh.reduce_dtype),
             "[fsdp-train] --param-dtype and --reduce-dtype need --shard full (they are "
             "fully_shard's policy)");
  FSDP_CHECK(profile.profile_steps.begin >= 0,
             "[fsdp-train] --profile-steps {}:{} starts before step 0", profile.profile_steps.begin,
             profile.profile_steps.end);
  FSDP_CHECK(sh.hsdp >= 0, "[fsdp-train] --hsdp must be >= 0 (0 = off), got {}", sh.hsdp);
  FSDP_CHECK(sh.hsdp == 0 || full, "[fsdp-train] --hsdp needs --shard full");
  FSDP_CHECK(sh.expert_parallel >= 1,
             "[fsdp-train] --expert-parallel must be >= 1 (1 = off), got {}", sh.expert_parallel);
  if (sh.expert_parallel > 1) {
    // What expert parallel does not cover yet, refused rather than run with experts laid out as
    // the rest of the model expects.
    const auto refuse = [&](bool bad, const char* what) {
      FSDP_CHECK(!bad, "[fsdp-train] --expert-parallel {} is not supported with {}",
                 sh.expert_parallel, what);
    };
    refuse(!full, "--shard none (the experts are sharded by fully_shard)");
    refuse(sh.hsdp > 0, "--hsdp");
    refuse(model.base_quant == "keep", "--base-quant keep (the GGUF's packed rows are whole tensors)");
  }
  FSDP_CHECK(sh.activation_checkpoint.every >= 0,
             "[fsdp-train] --activation-checkpoint every:{} must be >= 1",
             sh.activation_checkpoint.every);
  FSDP_CHECK(sc.warmup_steps >= 0 && sc.min_lr >= 0 && data.eval_every >= 0 && ck.ckpt_every >= 0 &&
                 ck.keep >= 0,
             "[fsdp-train] --warmup-steps, --min-lr, --eval-every, --ckpt-every and --keep must "
             "be >= 0");
  const bool dir = !ck.ckpt_dir.empty();
  FSDP_CHECK(ck.ckpt_every == 0 || dir, "[fsdp-train] --ckpt-every needs --ckpt-dir");
  FSDP_CHECK(!ck.async_checkpoint || dir, "[fsdp-train] --async-checkpoint needs --ckpt-dir");
  FSDP_CHECK(!ck.resume || dir, "[fsdp-train] --resume needs --ckpt-dir");
  FSDP_CHECK(!ck.overwrite || dir, "[fsdp-train] --overwrite needs --ckpt-dir");
  FSDP_CHECK(
      !(ck.overwrite && ck.resume),
      "[fsdp-train] --overwrite clears --ckpt-dir and --resume continues from it: choose one");
  FSDP_CHECK(full || (!dir && !op.wd_2d_only),
             "[fsdp-train] checkpoints and --wd-2d-only need --shard full");
  // AdamW's hyper-parameters: a zero eps divides by zero on the first step.
  FSDP_CHECK(op.eps > 0 && std::isfinite(op.eps), "[fsdp-train] --eps must be > 0, got {}", op.eps);
  FSDP_CHECK(op.beta1 >= 0 && op.beta1 < 1 && op.beta2 >= 0 && op.beta2 < 1,
             "[fsdp-train] --beta1 and --beta2 must be in [0, 1), got {} and {}", op.beta1,
             op.beta2);
  FSDP_CHECK(op.weight_decay >= 0 && std::isfinite(op.weight_decay),
             "[fsdp-train] --weight-decay must be >= 0, got {}", op.weight_decay);
  FSDP_CHECK(sc.min_lr <= op.lr,
             "[fsdp-train] --min-lr {} is above --lr {}: the schedule would rise", sc.min_lr,
             op.lr);
  FSDP_CHECK(sc.decay_steps >= 0, "[fsdp-train] --decay-steps must be >= 0 (0 = --steps), got {}",
             sc.decay_steps);
  FSDP_CHECK(data.eval_batches >= 1, "[fsdp-train] --eval-batches must be >= 1, got {}",
             data.eval_batches);
  FSDP_CHECK(data.pack_eos >= -1,
             "[fsdp-train] --pack-eos must be a token id >= 0 (unset: the tokenizer's EOS), got "
             "{}",
             data.pack_eos);
  FSDP_CHECK(
      data.pack_eos == -1 || data.pack,
      "[fsdp-train] --pack-eos {} needs --pack: it ends the documents that --pack packs, and "
      "without --pack it would be ignored",
      data.pack_eos);
  {  // the same file for both: the validation loss would be measured on the training data
    std::error_code ec;
    FSDP_CHECK(
        data.val_data.empty() || (data.val_data != data.data &&
                                  !std::filesystem::equivalent(data.val_data, data.data, ec)),
        "[fsdp-train] --val-data {} is the --data file {}: the validation loss would be "
        "measured on the training data; give held-out data, or leave --val-data out to "
        "hold out the last --val-fraction",
        data.val_data, data.data);
  }
  FSDP_CHECK(data.val_fraction > 0 && data.val_fraction < 1,
             "[fsdp-train] --val-fraction must be in (0, 1), got {}", data.val_fraction);
  FSDP_CHECK(!data.eval_at_start || data.eval_every > 0 || !data.val_data.empty(),
             "[fsdp-train] --eval-at-start evaluates on the validation data: give --eval-every N "
             "or --val-data FILE");
  FSDP_CHECK(sample.sample_tokens >= 0, "[fsdp-train] --sample-tokens must be >= 0, got {}",
             sample.sample_tokens);
  FSDP_CHECK(sample.temperature >= 0 && std::isfinite(sample.temperature),
             "[fsdp-train] --temperature must be >= 0 (0 = greedy), got {}", sample.temperature);
}

}  // namespace fsdp::train
