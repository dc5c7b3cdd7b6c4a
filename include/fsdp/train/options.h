// TrainOptions: fsdp-train's flags as typed sections (model, optimizer, schedule, sharding,
// data, sample, checkpoint, profile, run), each field one line of flags.def, in the manner of
// torchtitan's config sections. Enums hold enums, not strings; every value is read and printed by
// FlagValue<T>, so the command line, --help and set_flag() are generated from the one table:
//
//   train::TrainOptions o;                        // the reference script's defaults
//   o.schedule.steps = 100;
//   train::set_flag(o, "--lr-decay", "cosine");   // as the command line would
//   o.validate();                                 // throws, naming the flag and the value
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/optim/lr_schedule.h"

namespace fsdp::train {

// --shard: full (fully_shard every block and the root) or none (replicate: the DDP baseline).
enum class ShardMode : uint8_t { full, none };

// --activation-checkpoint: none (0), full (1: every block) or every:N (blocks 0, N, 2N, ...:
// torchtitan's selective layer checkpointing).
struct ActivationCheckpoint {
  int64_t every = 0;
  bool operator==(const ActivationCheckpoint&) const = default;
};

// --profile-steps A:B: steps A (included) to B (not); empty when B <= A (the default, off).
struct StepRange {
  int64_t begin = 0, end = 0;
  bool empty() const { return end <= begin; }
  bool operator==(const StepRange&) const = default;
};

#define FSDP_TRAIN_SECTION(section, Struct, title) struct Struct {
#define FSDP_TRAIN_FLAG(section, Type, field, default_value, aliases, help) \
  Type field = default_value;
#define FSDP_TRAIN_SECTION_END(section) \
  }                                     \
  ;
#include "fsdp/train/flags.def"

struct TrainOptions {
#define FSDP_TRAIN_SECTION(section, Struct, title) Struct section;
#include "fsdp/train/flags.def"

  // The preset with its overrides applied, validated.
  nn::TransformerConfig model_config() const;
  // --lora-rank, --lora-alpha and --lora-targets for a model of `arch`, checked (rank 0: none;
  // targets "all": every projection the architecture has; with `moe`, a mixture of experts, the
  // attention's q, k, v and o: its experts and router stay frozen).
  nn::LoraConfig lora_config(nn::Arch arch, bool moe = false) const;
  // Throws, naming the flag and the value, on any option out of range or inconsistent with
  // another (the model's own checks are model_config's).
  void validate() const;
};

// How a flag's value is read from the command line and printed (--help's defaults). parse throws
// fsdp::Error naming the flag, the text and what was expected. type_name is --help's.
template <class T>
struct FlagValue;
#define FSDP_FLAG_VALUE(T)                                        \
  template <>                                                     \
  struct FlagValue<T> {                                           \
    static T parse(std::string_view flag, std::string_view text); \
    static std::string str(const T& v);                           \
    static const char* type_name();                               \
  };
FSDP_FLAG_VALUE(bool)
FSDP_FLAG_VALUE(int)
FSDP_FLAG_VALUE(int64_t)
FSDP_FLAG_VALUE(uint64_t)
FSDP_FLAG_VALUE(double)
FSDP_FLAG_VALUE(std::string)
FSDP_FLAG_VALUE(DType)
FSDP_FLAG_VALUE(Device)
FSDP_FLAG_VALUE(nn::Arch)
FSDP_FLAG_VALUE(optim::Decay)
FSDP_FLAG_VALUE(ShardMode)
FSDP_FLAG_VALUE(ActivationCheckpoint)
FSDP_FLAG_VALUE(StepRange)
#undef FSDP_FLAG_VALUE
template <class T>
struct FlagValue<std::optional<T>> {  // unset until given
  static std::optional<T> parse(std::string_view flag, std::string_view text) {
    return FlagValue<T>::parse(flag, text);
  }
  static std::string str(const std::optional<T>& v) { return v ? FlagValue<T>::str(*v) : ""; }
  static const char* type_name() { return FlagValue<T>::type_name(); }
};

// One row of flags.def, as visit_flags hands it out.
struct FlagInfo {
  std::string_view section;  // "optimizer"
  std::string_view title;    // the section's, for --help
  std::string_view field;    // "grad_clip"
  std::string_view aliases;  // "--clip", or empty
  std::string_view help;
  bool is_switch;            // a bool defaulting to false: --flag sets it, and takes no value
  std::string name() const;  // "--grad-clip"
};

namespace detail {
template <class T>
constexpr bool is_switch(const T& default_value) {
  if constexpr (std::is_same_v<T, bool>)
    return !default_value;
  else
    return false;
}
}  // namespace detail

// Calls f(info, o.section.field) for every flag of flags.def, in its order (o: a TrainOptions,
// const or not).
template <class Options, class F>
requires std::is_same_v<std::remove_const_t<Options>, TrainOptions>
void visit_flags(Options& o, F&& f) {
#define FSDP_TRAIN_SECTION(section, Struct, title) \
  {                                                \
    constexpr std::string_view kTitle = title;
#define FSDP_TRAIN_FLAG(section, Type, field, default_value, aliases, help)                    \
  f(FlagInfo{#section, kTitle, #field, aliases, help, detail::is_switch(Type{default_value})}, \
    o.section.field);
#define FSDP_TRAIN_SECTION_END(section) }
#include "fsdp/train/flags.def"
}

// Sets the flag named `flag` (its --name or an alias) from text as the command line would;
// a switch takes "true"/"false". Throws naming the flag when there is no such flag or the text is
// not a value of its type.
void set_flag(TrainOptions& o, std::string_view flag, std::string_view text);

// Every flag and its value as the command line writes it, a JSON object ({"--lr": "0.0003", ...};
// an unset optional is ""): saved in each checkpoint's config, where a resume finds what changed.
std::string flags_json(const TrainOptions& o);

}  // namespace fsdp::train
