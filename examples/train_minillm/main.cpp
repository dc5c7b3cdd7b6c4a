// fsdp-train: trains the MiniLLM. The C++ form of the reference PyTorch
// script (train_fsdp.py; see README.md): the same model, the same defaults
// (AdamW lr 3e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, random
// tokens, batch 8 x 1024) and the same per-step line, plus tokens/s and MFU:
//   step 3 | loss 7.1234 | 1234 tok/s | mfu 41.2% | peak mem 0.52 GB
// With --data FILE it trains on the file's bytes and prints a sample at the end.
//
// Launched with mpirun, scripts/fsdprun or torchrun, it trains sharded with
// fully_shard on every block and on the root (FSDP2's recipe). The loop is
// the library's train::Trainer (fsdp/train/trainer.h); this file is its
// command line. It is the only place that catches fsdp::Error: it prints the
// message and exits non-zero.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/env.h"
#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/distributed/init.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/ops/blas.h"
#include "fsdp/train/config_file.h"
#include "fsdp/train/options.h"
#include "fsdp/train/trainer.h"

namespace {

// Every rank must run with the same config: each flag's resolved value (after the checkpoint's
// flags on --resume, --config's file and its includes, and the command line) is hashed, the hashes
// all-gathered once, and the flags that differ are named with this rank's values. The command
// line alone was compared before: a --config file of other contents at the same path on another
// node trained rank 1 at another --lr, silently.
void check_same_config(fsdp::dist::ProcessGroup& pg, const fsdp::train::TrainOptions& o) {
  if (pg.size() == 1) return;
  std::vector<std::pair<std::string, std::string>> flags;  // --name, value
  fsdp::train::visit_flags(o, [&](const fsdp::train::FlagInfo& f, const auto& field) {
    using T = std::remove_cvref_t<decltype(field)>;
    flags.emplace_back(f.name(), fsdp::train::FlagValue<T>::str(field));
  });
  // A fixed number of slots, so ranks of two builds with other flag tables still meet: slot 0
  // holds the count, flags past the last slot are folded into it.
  constexpr size_t kSlots = 256;
  auto fnv = [](std::string_view s, uint32_t h) {
    for (unsigned char c : s) h = (h ^ c) * 16777619u;
    return h;
  };
  fsdp::Tensor mine = fsdp::Tensor::zeros({int64_t(kSlots) + 1}, fsdp::DType::f64);
  double* m = mine.data<double>();
  m[0] = double(flags.size());
  for (size_t i = 0; i < flags.size(); ++i) {
    double& slot = m[std::min(i + 1, kSlots)];
    const uint32_t seed = i + 1 < kSlots ? 2166136261u : uint32_t(slot);
    slot = double(fnv(flags[i].second, fnv(flags[i].first, seed)));
  }
  const int64_t n = int64_t(kSlots) + 1;
  fsdp::Tensor all = fsdp::Tensor::empty({n * pg.size()}, fsdp::DType::f64, pg.device());
  pg.all_gather_into_tensor(all, mine.to(pg.device()))->wait();
  const std::vector<double> v = all.to_f64_vector();
  std::vector<int> ranks;      // the ranks that differ from rank 0
  std::vector<size_t> differ;  // the flags (slots) that differ on any rank
  for (int r = 1; r < pg.size(); ++r) {
    bool any = false;
    for (size_t i = 0; i <= kSlots; ++i)
      if (v[size_t(r) * kSlots + size_t(r) + i] != v[i]) {
        any = true;
        if (std::find(differ.begin(), differ.end(), i) == differ.end()) differ.push_back(i);
      }
    if (any) ranks.push_back(r);
  }
  if (ranks.empty()) return;
  std::sort(differ.begin(), differ.end());
  std::string names, here;
  for (size_t i : differ) {
    const bool known = i > 0 && i < kSlots && i - 1 < flags.size();
    const std::string name = i == 0  ? std::string("the number of flags")
                             : known ? flags[i - 1].first
                             : i < kSlots
                                 ? fmt::format("flag {} (this build has {})", i, flags.size())
                                 : std::string("the flags past the 255th");
    names += (names.empty() ? "" : ", ") + name;
    if (known)
      here += fmt::format("{}{} '{}'", here.empty() ? "" : ", ", flags[i - 1].first,
                          flags[i - 1].second);
  }
  std::string which;
  for (int r : ranks) which += (which.empty() ? "" : ", ") + std::to_string(r);
  FSDP_FAIL(
      "[fsdp-train] the ranks resolved different configs (the flags after --config, its includes "
      "and the command line): rank(s) {} differ from rank 0 in {} (this rank, {}, has {}); every "
      "rank must run with the same config: give each node the same --config file",
      which, names, pg.rank(), here.empty() ? "other values there" : here);
}

// fsdp-train's command line, generated from flags.def: a flag per field, in --help's groups by
// section, read by FlagValue (the same reading as train::set_flag). A value FlagValue refuses is
// a parse error naming the flag.
void add_flags(CLI::App& app, fsdp::train::TrainOptions& o) {
  fsdp::train::visit_flags(o, [&](const fsdp::train::FlagInfo& f, auto& field) {
    using T = std::remove_cvref_t<decltype(field)>;
    using Value = fsdp::train::FlagValue<T>;
    std::string names = f.name();
    if (!f.aliases.empty()) names += "," + std::string(f.aliases);
    CLI::Option* opt = nullptr;
    if constexpr (std::is_same_v<T, bool>) {
      if (f.is_switch) opt = app.add_flag(names, field, std::string(f.help));
    }
    if (!opt) {
      opt = app.add_option_function<std::string>(
          names,
          [&field, flag = f.name()](const std::string& text) {
            try {
              field = Value::parse(flag, text);
            } catch (const fsdp::Error& e) {
              throw CLI::ValidationError(std::string(fsdp::without_source_place(e.what())));
            }
          },
          std::string(f.help));
      opt->type_name(Value::type_name());
      if (const std::string d = Value::str(field); !d.empty()) opt->default_str(d);
    }
    opt->group(std::string(f.title));
  });
}

}  // namespace

// The value of --config (as "--config FILE" or "--config=FILE"), looked for before the command
// line is parsed: the file's flags go under the command line's.
std::string config_arg(int argc, char** argv) {
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--config" && i + 1 < argc) path = argv[++i];
    else if (a.starts_with("--config=")) path = std::string(a.substr(9));
  }
  return path;
}

// The options, in the order that overrides: the defaults, then (--resume --ckpt-dir D) the flags
// the run in D was started with, then --config's file, then the command line. Returns the exit
// code when the process should end here (--help, a parse error, --print-config), else -1.
int read_options(int argc, char** argv, fsdp::train::TrainOptions& o) {
  const std::string config = config_arg(argc, argv);
  bool print_config = false;
  auto layer = [&](fsdp::train::TrainOptions& into, bool quiet) -> int {
    if (!config.empty()) fsdp::train::load_config_file(into, config);
    CLI::App app{"fsdp-train: train the MiniLLM (the C++ form of the reference FSDP2 script)",
                 "fsdp-train"};
    app.get_formatter()->column_width(34);
    app.option_defaults()->multi_option_policy(
        CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides an earlier one
    std::string unused;
    app.add_option("--config", unused,
                   "read the run's flags from this TOML file ([section] key = value, as "
                   "--print-config writes; include = \"base.toml\"); the command line overrides it")
        ->group("Config");
    app.add_flag("--print-config", print_config,
                 "print the resolved config as TOML (a --config file) and exit")
        ->group("Config");
    add_flags(app, into);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);  // --help
      if (!quiet)
        fmt::print(stderr, "fsdp-train: error: {}\nRun with --help for the flags.\n", e.what());
      return 2;
    }
    return -1;
  };
  if (const int rc = layer(o, false); rc >= 0) return rc;
  if (o.checkpoint.resume && !o.checkpoint.ckpt_dir.empty()) {
    fsdp::train::TrainOptions run;
    if (!fsdp::train::apply_checkpoint_flags(run, o.checkpoint.ckpt_dir).empty()) {
      if (const int rc = layer(run, false); rc >= 0) return rc;
      o = run;
    }
  }
  if (print_config) {
    fmt::print("{}", fsdp::train::config_toml(o));
    return 0;
  }
  return -1;
}

int main(int argc, char** argv) {
  fsdp::ops::use_best_blas_kernel(argv);  // before anything else: it may re-execute
  fsdp::train::TrainOptions o;
  try {
    if (const int rc = read_options(argc, argv, o); rc >= 0) return rc;
  } catch (const std::exception& e) {  // a --config file or the checkpoint's flags: input files,
    // exit 1 as for any other file the run reads (a command line CLI11 refuses is 2, above)
    fmt::print(stderr, "fsdp-train: error: {}\n", fsdp::without_source_place(e.what()));
    return 1;
  }
  try {
    fsdp::validate_env();  // every FSDP_* knob, by name, before anything reads one
    o.validate();          // every flag, before the ranks meet
    const fsdp::Device device = o.run.device;
    FSDP_CHECK(
        device.is_cpu() || fsdp::cuda_available(),
        "[fsdp-train] --device {}: no CUDA device is visible (or fsdp.cpp was built without CUDA)",
        device.str());
    fsdp::train::install_stop_handlers();  // SIGTERM/SIGINT: checkpoint after this step, exit 0
    {
      auto pg = fsdp::dist::init_process_group({.device = device, .backend = o.run.backend});
      check_same_config(*pg, o);
      fsdp::train::Trainer trainer(o, pg);
      trainer.fit();
    }
    fsdp::dist::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    // Peers may be waiting in a collective this rank will never join: end the
    // job instead of unwinding into destructors that wait for them.
    const int rank = fsdp::dist::is_initialized() ? fsdp::dist::world_info().rank : 0;
    // The source place FSDP_CHECK appends is for developers; a user sees what was wrong.
    fmt::print(stderr, "fsdp-train: error{}: {}\n", rank ? fmt::format(" (rank {})", rank) : "",
               fsdp::without_source_place(e.what()));
    fsdp::dist::abort_process(1);
  }
}
