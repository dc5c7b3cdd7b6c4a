// The MiniLLM training loop (fsdp/train/trainer.h): setup, steps, validation,
// checkpoints, the profile window and the run's summary.
#include "fsdp/train/trainer.h"

#include <fmt/core.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <compare>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/checkpoint/manager.h"
#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/core/allocator.h"
#include "fsdp/core/env.h"
#include "fsdp/core/host_memory.h"
#include "fsdp/core/host_sync.h"
#include "fsdp/core/interrupt.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/dist/device_mesh.h"
#include "fsdp/dist/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/fsdp/replicate.h"
#include "fsdp/nn/init.h"
#include "fsdp/nn/loss.h"
#include "fsdp/nn/sample.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/clip.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/profiler/ceilings.h"
#include "fsdp/profiler/metrics.h"
#include "fsdp/profiler/profiler.h"
#include "fsdp/train/memory_plan.h"

namespace fsdp::train {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Default threads: this rank's share of the cores it may run on (mpirun binds
// each rank to a core unless told --bind-to none).
int rank_threads(int requested, int local_size) {
  if (requested > 0) return requested;
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t mask;
  const int allowed = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : hw;
  return std::max(1, std::min(allowed, hw / std::max(1, local_size)));
}

// --profile-steps A:B: profiles steps [A, B) and writes each rank's trace and table.
class ProfileWindow {
 public:
  ProfileWindow(const std::string& spec, std::string dir, int rank, Device device)
      : dir_(std::move(dir)), rank_(rank), device_(device) {
    if (spec.empty()) return;
    const auto colon = spec.find(':');
    try {
      FSDP_CHECK(colon != std::string::npos, "");
      begin_ = std::stoll(spec.substr(0, colon));
      end_ = std::stoll(spec.substr(colon + 1));
    } catch (const std::exception&) {
      FSDP_FAIL("[fsdp-train] --profile-steps '{}' must be A:B, the steps [A, B) to profile", spec);
    }
    FSDP_CHECK(begin_ >= 0 && end_ > begin_, "[fsdp-train] --profile-steps '{}': need 0 <= A < B",
               spec);
  }
  void at_step(int64_t step) {
    if (step == begin_) {
      std::vector<profiler::Activity> acts = {profiler::Activity::CPU};
      if (device_.is_cuda()) acts.push_back(profiler::Activity::CUDA);
      prof_ =
          std::make_unique<profiler::Profiler>(profiler::ProfilerOptions{.activities = acts,
                                                                         .record_shapes = true,
                                                                         .profile_memory = true,
                                                                         .schedule = std::nullopt,
                                                                         .rank = rank_});
      prof_->start();
    }
    if (step == end_) finish();
  }
  void finish() {
    if (!prof_) return;
    prof_->stop();
    std::filesystem::create_directories(dir_);
    const std::string trace = fmt::format("{}/trace_rank{}.json", dir_, rank_);
    prof_->export_chrome_trace(trace);
    const std::string table = prof_->key_averages().table(
                                  device_.is_cuda() ? "device_time_total" : "cpu_time_total", 15) +
                              prof_->overlap_summary() + "\n";
    std::ofstream(fmt::format("{}/table_rank{}.txt", dir_, rank_)) << table;
    if (rank_ == 0)
      fmt::print("profile: steps {}:{} -> {} (and the other ranks')\n{}", begin_, end_, trace,
                 table);
    prof_.reset();
  }

 private:
  std::string dir_;
  int rank_;
  Device device_;
  int64_t begin_ = -1, end_ = -1;
  std::unique_ptr<profiler::Profiler> prof_;
};

// An output folder this run will write: created, and a file written and removed in it now,
// so a folder that cannot be written is refused at the start, naming the system's reason, not
// at the first save N steps in.
void check_writable_dir(const std::string& dir, const char* flag, int rank) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  FSDP_CHECK(!ec, "[fsdp-train] {} '{}' cannot be created: {}", flag, dir, ec.message());
  const fs::path probe = fs::path(dir) / fmt::format(".fsdp_write_test_rank{}", rank);
  {
    std::ofstream f(probe);
    const int err = errno;
    FSDP_CHECK(f.good(), "[fsdp-train] {} '{}' cannot be written: {}", flag, dir,
               std::strerror(err));
  }
  fs::remove(probe, ec);
}

// --init-from a pretrained model: the architecture is the model's. A model-shape flag that says
// otherwise is refused by name; flags not given take the model's values; seq and batch are the
// run's (flags, else the preset's).
nn::MiniLLMConfig config_from_model(const TrainOptions& o, const checkpoint::Pretrained& pre) {
  nn::MiniLLMConfig c = *pre.config;
  auto check = [&](const char* flag, const auto& given, const auto& model) {
    if (given)
      FSDP_CHECK(*given == model,
                 "[fsdp-train] {} {} contradicts the model: {} has {} (the architecture comes "
                 "from --init-from; drop the flag or give the model's value)",
                 flag, *given, pre.path, model);
  };
  std::optional<std::string> arch;
  if (o.arch) arch = nn::arch_name(nn::parse_arch(*o.arch));
  check("--arch", arch, nn::arch_name(c.arch));
  check("--vocab", o.vocab, c.vocab);
  check("--dim", o.dim, c.dim);
  check("--layers", o.layers, c.layers);
  check("--heads", o.heads, c.heads);
  check("--ffn-hidden", o.ffn_hidden, c.resolved_ffn_hidden());
  check("--kv-heads", o.kv_heads, c.resolved_kv_heads());
  check("--head-dim", o.head_dim, c.resolved_head_dim());
  check("--rope-theta", o.rope_theta, c.rope_theta);
  FSDP_CHECK(!o.tie_embeddings || c.tie_embeddings,
             "[fsdp-train] --tie-embeddings contradicts the model: {} has an untied head",
             pre.path);
  FSDP_CHECK(!o.qkv_bias || c.qkv_bias,
             "[fsdp-train] --qkv-bias contradicts the model: {} has no q/k/v biases", pre.path);
  const nn::MiniLLMConfig preset = nn::MiniLLMConfig::preset(o.preset);
  c.seq = o.seq.value_or(preset.seq);
  c.batch = o.batch.value_or(preset.batch);
  c.validate();
  return c;
}

// A plain text file (not llm.c shards): encoded with a real tokenizer, not read as bytes.
bool is_text_file(const std::string& spec) {
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(spec) || spec.ends_with(".bin")) return false;
  std::ifstream f(spec, std::ios::binary);
  int32_t magic = 0;
  f.read(reinterpret_cast<char*>(&magic), 4);
  return !(f.gcount() == 4 && (magic == 20240520 || magic == 20240801));
}

// --resume: the run's data must be the checkpoint's, by content (data::data_identity: size and
// sampled bytes), not by path: the same path with new contents is refused, a byte-identical copy
// elsewhere resumes. The training stream's token count must match too (--eval-every and
// --val-fraction cut the validation tail off it), or window numbers would name other tokens.
// Checkpoints older than the identity are held to the path, as they were.
void check_same_data(const nlohmann::json& saved, const nlohmann::json& now,
                     const std::string& path) {
  using nlohmann::json;
  auto value = [](const json& j, const char* key) { return j.value(key, json()); };
  if (saved.contains("data_content")) {
    FSDP_CHECK(saved["data_content"] == value(now, "data_content"),
               "[fsdp-train] --resume: {} was trained on other data: it was saved with --data {} "
               "holding {} but --data {} holds {}; resume with the data it was trained on, or "
               "start a new --ckpt-dir",
               path, value(saved, "data").dump(), saved["data_content"].dump(),
               value(now, "data").dump(), value(now, "data_content").dump());
  }
  const bool by_path = !saved.contains("data_content");
  for (const char* key : {"seq", "data", "data_tokens", "tokenizer_hash"})
    if (saved.contains(key) && (by_path || std::string_view(key) != "data"))
      FSDP_CHECK(saved[key] == value(now, key),
                 "[fsdp-train] --resume: {} was saved with {} {} but this run has {} {}: resume "
                 "with the same data, validation split, sequence length and tokenizer, or start a "
                 "new --ckpt-dir",
                 path, key, saved[key].dump(), key, value(now, key).dump());
}

// The windows a checkpoint's run had read over all its ranks: saved as such ("data" in the
// checkpoint's user JSON), or, by checkpoints from before, as the loader's batch index, which
// counts global batches of the saved batch x world_size rows. *note says which it was.
int64_t windows_read(const checkpoint::Loaded& loaded, const nlohmann::json& saved_config,
                     const std::string& path, std::string* note) {
  const nlohmann::json user = nlohmann::json::parse(loaded.user_json);
  if (user.is_object() && user.contains("data")) {
    const nlohmann::json& d = user["data"];
    FSDP_CHECK(d.is_object() && d.contains("windows") && d["windows"].is_number_integer() &&
                   d["windows"].get<int64_t>() >= 0,
               "[fsdp-train] --resume: {}/metadata.json: user.data {} is not a count of windows "
               "read",
               path, d.dump());
    return d["windows"].get<int64_t>();
  }
  auto count = [&](const char* key) -> int64_t {
    const nlohmann::json v = saved_config.value(key, nlohmann::json());
    FSDP_CHECK(v.is_number_integer() && v.get<int64_t>() > 0,
               "[fsdp-train] --resume: {} saved its data position as batch {} but its config has "
               "no {} (got {}) to say how many rows a batch held, so the next unread window is "
               "unknown; start a new --ckpt-dir",
               path, loaded.data_position, key, v.dump());
    return v.get<int64_t>();
  };
  const int64_t rows = count("batch") * count("world_size");
  *note = fmt::format(
      "an older checkpoint: its data position is batch {} of {} x {} rows, window {}",
      loaded.data_position, count("batch"), count("world_size"), loaded.data_position * rows);
  return loaded.data_position * rows;
}

std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) {
  request_stop(sig);  // the library's waits (store, collectives) give up once a step had its time
  if (g_stop_signal.exchange(sig) != 0) {  // the second one: leave now
    const char msg[] = "fsdp-train: second stop signal: exiting without a checkpoint\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    _exit(128 + sig);
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int stop_signal() { return g_stop_signal.load(); }

int64_t checkpoint_every_blocks(const std::string& mode) {
  if (mode == "none") return 0;
  if (mode == "full") return 1;
  int64_t n = 0;
  const char* b = mode.data() + 6;
  const char* e = mode.data() + mode.size();
  const bool parsed = mode.rfind("every:", 0) == 0 && std::from_chars(b, e, n).ptr == e && n >= 1;
  FSDP_CHECK(parsed && mode.size() > 6,
             "[fsdp-train] --activation-checkpoint must be none, full or every:N (N >= 1), got "
             "'{}'",
             mode);
  return n;
}

nn::MiniLLMConfig TrainOptions::model_config() const {
  nn::MiniLLMConfig cfg = nn::MiniLLMConfig::preset(preset);
  if (arch) cfg.arch = nn::parse_arch(*arch);
  if (vocab) cfg.vocab = *vocab;
  if (dim) cfg.dim = *dim;
  if (layers) cfg.layers = *layers;
  if (heads) cfg.heads = *heads;
  if (seq) cfg.seq = *seq;
  if (batch) cfg.batch = *batch;
  if (ffn_hidden) cfg.ffn_hidden = *ffn_hidden;
  if (kv_heads) cfg.kv_heads = *kv_heads;
  if (head_dim) cfg.head_dim = *head_dim;
  if (rope_theta) cfg.rope_theta = *rope_theta;
  if (tie_embeddings) cfg.tie_embeddings = true;
  if (qkv_bias) cfg.qkv_bias = true;
  cfg.validate();
  return cfg;
}

void TrainOptions::validate() const {
  FSDP_CHECK(steps >= 0, "[fsdp-train] --steps must be >= 0, got {}", steps);
  FSDP_CHECK(lr >= 0 && std::isfinite(lr), "[fsdp-train] --lr must be a finite number >= 0, got {}",
             lr);
  FSDP_CHECK(threads >= 0,
             "[fsdp-train] --threads must be >= 0 (0 = this rank's share of the cores), got {}",
             threads);
  FSDP_CHECK(grad_accum >= 1, "[fsdp-train] --grad-accum must be >= 1, got {}", grad_accum);
  FSDP_CHECK(shard == "full" || shard == "none",
             "[fsdp-train] --shard must be full or none, got '{}'", shard);
  FSDP_CHECK(clip >= 0, "[fsdp-train] --clip must be >= 0 (0 = off), got {}", clip);
  const DType d = parse_dtype(dtype);
  FSDP_CHECK(d == DType::f32 || d == DType::f64,
             "[fsdp-train] --dtype {} is not a CPU training dtype; use f32 or f64 for the (master) "
             "parameters and --param-dtype bf16 for bf16 compute",
             dtype);
  FSDP_CHECK(shard == "full" || (param_dtype.empty() && reduce_dtype.empty()),
             "[fsdp-train] --param-dtype and --reduce-dtype need --shard full (they are "
             "fully_shard's policy)");
  FSDP_CHECK(hsdp >= 0, "[fsdp-train] --hsdp must be >= 0 (0 = off), got {}", hsdp);
  FSDP_CHECK(hsdp == 0 || shard == "full", "[fsdp-train] --hsdp needs --shard full");
  FSDP_CHECK(lr_decay == "none" || lr_decay == "cosine" || lr_decay == "linear",
             "[fsdp-train] --lr-decay must be none, cosine or linear, got '{}'", lr_decay);
  (void)checkpoint_every_blocks(activation_checkpoint);
  FSDP_CHECK(
      warmup >= 0 && min_lr >= 0 && eval_every >= 0 && ckpt_every >= 0 && keep >= 0,
      "[fsdp-train] --warmup-steps, --min-lr, --eval-every, --ckpt-every and --keep must be >= 0");
  FSDP_CHECK(ckpt_every == 0 || !ckpt_dir.empty(), "[fsdp-train] --ckpt-every needs --ckpt-dir");
  FSDP_CHECK(!async_checkpoint || !ckpt_dir.empty(),
             "[fsdp-train] --async-checkpoint needs --ckpt-dir");
  FSDP_CHECK(!resume || !ckpt_dir.empty(), "[fsdp-train] --resume needs --ckpt-dir");
  FSDP_CHECK(!overwrite || !ckpt_dir.empty(), "[fsdp-train] --overwrite needs --ckpt-dir");
  FSDP_CHECK(
      !(overwrite && resume),
      "[fsdp-train] --overwrite clears --ckpt-dir and --resume continues from it: choose one");
  FSDP_CHECK(shard == "full" || (ckpt_dir.empty() && !wd_2d_only),
             "[fsdp-train] checkpoints and --wd-2d-only need --shard full");
  // AdamW's hyper-parameters: a zero eps divides by zero on the first step.
  FSDP_CHECK(eps > 0 && std::isfinite(eps), "[fsdp-train] --eps must be > 0, got {}", eps);
  FSDP_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
             "[fsdp-train] --beta1 and --beta2 must be in [0, 1), got {} and {}", beta1, beta2);
  FSDP_CHECK(weight_decay >= 0 && std::isfinite(weight_decay),
             "[fsdp-train] --weight-decay must be >= 0, got {}", weight_decay);
  FSDP_CHECK(min_lr <= lr, "[fsdp-train] --min-lr {} is above --lr {}: the schedule would rise",
             min_lr, lr);
  FSDP_CHECK(decay_steps >= 0, "[fsdp-train] --decay-steps must be >= 0 (0 = --steps), got {}",
             decay_steps);
  FSDP_CHECK(eval_batches >= 1, "[fsdp-train] --eval-batches must be >= 1, got {}", eval_batches);
  FSDP_CHECK(val_fraction > 0 && val_fraction < 1,
             "[fsdp-train] --val-fraction must be in (0, 1), got {}", val_fraction);
  FSDP_CHECK(sample_tokens >= 0, "[fsdp-train] --sample-tokens must be >= 0, got {}",
             sample_tokens);
  FSDP_CHECK(temperature >= 0 && std::isfinite(temperature),
             "[fsdp-train] --temperature must be >= 0 (0 = greedy), got {}", temperature);
}

struct Trainer::Impl {
  TrainOptions o;
  std::shared_ptr<const checkpoint::Pretrained> pretrained;  // --init-from
  nn::MiniLLMConfig cfg;
  DType dtype;
  std::shared_ptr<dist::ProcessGroup> pg;
  std::shared_ptr<dist::DeviceMesh> mesh;
  int rank = 0, size = 1, threads = 1;
  Device device;
  MixedPrecisionPolicy mp;
  std::shared_ptr<data::TokenSource> src, val;
  std::optional<data::Tokenizer> tokenizer;
  bool model_tokenizer = false;  // the tokenizer came with the --init-from model
  std::unique_ptr<nn::MiniLLM> model;
  std::vector<nn::ParamGroup> groups;
  DataParallelModule* parallel = nullptr;  // the step's one interface: root, or replicate's
  FSDPModule* root = nullptr;              // --shard full: the sharded root, for checkpoints
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::LRSchedule> schedule;
  std::unique_ptr<data::DataLoader> loader;
  double peak = 0;           // FLOP/s, all ranks: the MFU denominator
  double peak_measured = 0;  // the peak before a step's rate raised it
  double peak_units = 1;     // what the peak is the sum over: machines (CPU) or GPUs
  MemoryPlan plan;  // this rank's predicted peak memory, from the shapes (check_memory_plan)
  std::string config_json;
  int64_t start_step = 0, steps_done = 0;
  std::ofstream log;
  // Communication: seconds in collectives on their threads, and seconds the
  // compute thread waited for them (exposed), summed over the timed steps.
  double comm_total = 0, exposed_total = 0, step_total = 0;
  int64_t steps_timed = 0;  // the steps those sums cover (a resume or a stop times fewer)
  double longest_step = 0;  // seconds
  // --ckpt-dir: the folder's owner (lock, one run per folder, resume, sync or background saves)
  std::unique_ptr<checkpoint::Manager> ckpt;

  bool main() const { return rank == 0; }

  Impl(const TrainOptions& options, std::shared_ptr<dist::ProcessGroup> group)
      : o(options),
        pretrained(options.init_from.empty() ? nullptr
                                             : std::make_shared<const checkpoint::Pretrained>(
                                                   checkpoint::load_pretrained(options.init_from))),
        cfg(pretrained && pretrained->config ? config_from_model(options, *pretrained)
                                             : options.model_config()),
        pg(std::move(group)) {
    o.validate();
    rank = pg->rank();
    if (!o.ckpt_dir.empty()) {
      check_writable_dir(o.ckpt_dir, "--ckpt-dir", pg->rank());
      ckpt = std::make_unique<checkpoint::Manager>(
          checkpoint::ManagerOptions{.dir = o.ckpt_dir,
                                     .resume = o.resume,
                                     .overwrite = o.overwrite,
                                     .keep = o.keep,
                                     .async = o.async_checkpoint},
          pg);
    }
    if (!o.profile_steps.empty()) check_writable_dir(o.profile_dir, "--profile-dir", pg->rank());
    size = pg->size();
    device = pg->device();
    dtype = parse_dtype(o.dtype);
    FSDP_CHECK(device.is_cpu() || dtype == DType::f32,
               "[fsdp-train] --dtype {} on CUDA: the kernels take f32 (master) "
               "with --param-dtype bf16 or f16",
               o.dtype);
    if (!o.param_dtype.empty()) mp.param_dtype = parse_dtype(o.param_dtype);
    if (!o.reduce_dtype.empty()) mp.reduce_dtype = parse_dtype(o.reduce_dtype);
    // Mesh: all ranks shard, or hsdp replica groups of size/hsdp ranks each.
    if (o.hsdp > 0) {
      FSDP_CHECK(size % o.hsdp == 0, "[fsdp-train] --hsdp {} does not divide the world size {}",
                 o.hsdp, size);
      mesh = dist::init_device_mesh({o.hsdp, size / o.hsdp}, {"replicate", "shard"});
    } else {
      mesh = dist::init_device_mesh({size}, {o.shard == "none" ? "replicate" : "shard"});
    }
    threads = rank_threads(o.threads, dist::world_info().local_size);
    omp_set_num_threads(threads);
    open_tokenizer();  // first: a text file is encoded with it
    open_data();
    if (tokenizer)
      FSDP_CHECK(tokenizer->size() <= cfg.vocab,
                 "[fsdp-train] the tokenizer ({}) has {} ids but the model's vocab is {}; pass "
                 "--vocab {} or more",
                 tokenizer->describe(), tokenizer->size(), cfg.vocab, tokenizer->size());
    const int64_t mem_before = memory_stats(device).current;
    build_model();
    const int64_t persistent_measured = memory_stats(device).current - mem_before;
    measure_peak();
    if (main()) {
      print_config(plan.persistent, persistent_measured);
      std::fflush(stdout);
    }
    // The run's config, saved in checkpoints; its model keys must match on resume.
    nlohmann::json run_config = nlohmann::json::parse(cfg.to_json());
    run_config.update({{"batch", cfg.batch},
                       {"seq", cfg.seq},
                       {"world_size", size},
                       {"seed", o.seed},
                       {"dtype", std::string(dtype_name(dtype))},
                       {"lr", o.lr},
                       {"data", o.data},
                       {"tokenizer", tokenizer ? tokenizer->describe() : "none"},
                       {"tokenizer_hash", tokenizer ? tokenizer->hash() : ""}});
    if (!o.data.empty()) {  // the data by content (a resume checks it), and the stream's length
      run_config["data_content"] = data::data_identity(o.data).str();
      if (const auto* s = dynamic_cast<const data::TokenStream*>(src.get()))
        run_config["data_tokens"] = s->size();
    }
    config_json = run_config.dump();
    loader = std::make_unique<data::DataLoader>(src, cfg.batch * size, rank, size, cfg.seq, device);
    if (o.resume) resume();
    if (main() && !o.log_file.empty()) {
      log.open(o.log_file, start_step > 0 ? std::ios::app : std::ios::trunc);
      const int err = errno;
      FSDP_CHECK(log.good(), "[fsdp-train] cannot write --log-file '{}': {}", o.log_file,
                 std::strerror(err));
    }
  }

  void open_data() {
    if (!o.data.empty()) {
      std::unique_ptr<data::TokenStream> stream = open_stream(o.data);
      if (o.shuffle) stream->set_shuffle(o.seed, cfg.seq);
      if (o.eval_every > 0 && o.val_data.empty()) {
        auto [train, tail] = stream->split_tail(o.val_fraction, cfg.seq);
        if (o.shuffle) train->set_shuffle(o.seed, cfg.seq);
        src = std::move(train);
        val = std::move(tail);
      } else {
        src = std::move(stream);
      }
      if (cfg.arch == nn::Arch::seed && main())
        fmt::print(stderr,
                   "warning: arch seed attends in both directions with no mask, so on text it "
                   "sees the next token it must predict; use --arch llama to learn a language "
                   "model\n");
    } else {
      src = std::make_shared<data::RandomTokenSource>(cfg.vocab, o.seed);
      if (o.eval_every > 0) val = std::make_shared<data::RandomTokenSource>(cfg.vocab, o.seed + 1);
    }
    if (!o.val_data.empty()) val = open_stream(o.val_data);
  }

  // llm.c shards or bytes; a text file is encoded with the run's tokenizer when it is not bytes
  // (a pretrained model's, say).
  std::unique_ptr<data::TokenStream> open_stream(const std::string& spec) {
    if (!tokenizer || tokenizer->is_bytes() || !is_text_file(spec))
      return data::open_token_stream(spec, cfg.vocab, cfg.seq);
    std::ifstream f(spec, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(f)), {});
    std::vector<int32_t> ids = tokenizer->encode(text);
    FSDP_CHECK(int64_t(ids.size()) > cfg.seq,
               "[fsdp-train] --data {}: {} tokens with {}, fewer than --seq {} + 1", spec,
               ids.size(), tokenizer->describe(), cfg.seq);
    const std::string what =
        fmt::format("{} ({} tokens, encoded with the tokenizer)", spec, ids.size());
    return std::make_unique<data::TokenVector>(std::move(ids), what, cfg.seq);
  }

  // The tokenizer of the data: the --init-from model's, named, found beside .bin shards, or the
  // bytes.
  void open_tokenizer() {
    namespace fs = std::filesystem;
    std::string path = o.tokenizer;
    if (path == "auto") {
      path = "bytes";
      if (!o.data.empty()) {
        fs::path p(o.data);
        const fs::path dir = fs::is_directory(p) ? p : p.parent_path();
        if (fs::exists(dir / "tokenizer.json") && o.data.find(".bin") != std::string::npos)
          path = (dir / "tokenizer.json").string();
        else if (fs::is_directory(p) && fs::exists(p / "tokenizer.json"))
          path = (p / "tokenizer.json").string();
      }
    }
    if (o.tokenizer == "auto" && o.data.empty() && cfg.vocab < 256)
      return;  // random ids below 256: no text, no tokenizer
    model_tokenizer =
        o.tokenizer == "auto" && pretrained && pretrained->config && pretrained->tokenizer;
    if (model_tokenizer)
      tokenizer = *pretrained->tokenizer;  // the model's own
    else
      tokenizer = path == "bytes" ? data::Tokenizer::bytes() : data::Tokenizer::from_file(path);
  }

  void build_model() {
    model = std::make_unique<nn::MiniLLM>(cfg);
    check_memory_plan();  // from the shapes alone, before any tensor exists
    if (o.shard == "full") {
      FullyShardOptions fo{.reshard_after_forward = o.reshard_after_forward,
                           .mp_policy = mp,
                           .init_dtype = dtype,
                           .seed = o.seed};
      for (size_t i = 0; i < model->layers().size(); ++i) fully_shard(model->layers()[i], mesh, fo);
      parallel = root = &fully_shard(*model, mesh, fo);
    } else {  // the DDP baseline: every rank holds all of it
      parallel = &replicate(*model, mesh, {.init_dtype = dtype, .seed = o.seed});
    }
    // --init-from: sharded, each rank reads only its own rows of each parameter into its shards;
    // replicated (no root), every rank reads them whole.
    if (pretrained) pretrained->load_into(*model, root);
    groups = parallel->param_groups(o.weight_decay, !o.wd_2d_only);
    // Activation checkpointing on blocks 0, N, 2N, ... (every block for full).
    if (const int64_t every = checkpoint_every_blocks(o.activation_checkpoint); every > 0)
      for (size_t i = 0; i < model->layers().size(); i += size_t(every))
        model->layers()[i].set_activation_checkpoint(true);
    opt = std::make_unique<optim::AdamW>(groups, ops::AdamWHyper{.lr = o.lr,
                                                                 .beta1 = o.beta1,
                                                                 .beta2 = o.beta2,
                                                                 .eps = o.eps,
                                                                 .weight_decay = o.weight_decay});
    schedule = std::make_unique<optim::LRSchedule>(
        optim::LRScheduleOptions{.lr = o.lr,
                                 .warmup = o.warmup,
                                 .decay = optim::parse_decay(o.lr_decay),
                                 .min_lr = o.min_lr,
                                 .decay_end = o.decay_steps > 0 ? o.decay_steps : o.steps});
  }

  // The memory plan (train/memory_plan.h): this rank's predicted peak, from the shapes alone,
  // against what is left for this host's ranks (CPU: the cgroup's limit or MemAvailable, for what
  // each rank will add to what it holds now; CUDA: the device's free memory); refused with the
  // numbers on every rank alike (--allow-oversubscribe-memory skips it). A 38B model under a
  // 3 GiB cgroup was OOM-killed after 3 s with no output.
  void check_memory_plan() {
    const int64_t held = device.is_cpu() ? resident_bytes() : 0;
    MemoryPlanOptions po{.model = cfg,
                         .device = device,
                         .fully_shard = o.shard == "full",
                         .shards = o.shard == "full" ? mesh->size(mesh->ndim() - 1) : 1,
                         .replicas = o.shard == "full" && mesh->ndim() == 2 ? mesh->size(0) : 1,
                         .reshard_after_forward = o.reshard_after_forward,
                         .dtype = dtype,
                         .param_dtype = mp.param_dtype,
                         .reduce_dtype = mp.reduce_dtype,
                         .grad_accum = o.grad_accum,
                         .checkpoint_every = checkpoint_every_blocks(o.activation_checkpoint),
                         .threads = threads,
                         .cpu_cache_bytes = int64_t(env_double("FSDP_CPU_CACHE_MB") * 1048576.0),
                         .baseline_bytes = held};
    plan = plan_memory(po);
    if (o.allow_oversubscribe_memory) return;
    const int local = device.is_cpu() ? std::max(1, dist::world_info().local_size) : 1;
    const int64_t more = plan.peak - held;  // what this rank will still take
    const auto [available, from] =
        device.is_cpu() ? host_memory_available()
                        : std::pair{cuda_memory_info(device.index).free,
                                    fmt::format("free on {}", device.str())};
    std::string error;
    if (available >= 0 && more * local > available) {
      std::string terms;
      for (const MemoryTerm& t : plan.terms)
        if (t.bytes > 0) terms += fmt::format("{}{} {:.2f}", terms.empty() ? "" : ", ", t.name,
                                              double(t.bytes) / 1e9);
      error = fmt::format(
          "[fsdp-train] the model does not fit: {} parameters need {:.2f} GB per rank for "
          "parameters, gradients and AdamW's two moments ({}, {} shard(s)) and {:.2f} GB at the "
          "predicted peak of a step (batch {} x seq {}: {}), {:.2f} GB more than a rank holds now, "
          "{:.2f} GB for the {} rank(s) on this {}, but only {:.2f} GB is available ({}); shard over "
          "more ranks, take a smaller model or batch, use --activation-checkpoint, or pass "
          "--allow-oversubscribe-memory to try anyway",
          model->num_parameters(), double(plan.persistent) / 1e9, dtype_name(dtype), po.shards,
          double(plan.peak) / 1e9, cfg.batch, cfg.seq, terms, double(more) / 1e9,
          double(more * local) / 1e9, local, device.is_cpu() ? "host" : "device",
          double(available) / 1e9, from);
    }
    Tensor failed = Tensor::full({1}, error.empty() ? 0.0 : 1.0, DType::f32).to(device);
    if (size > 1) pg->all_reduce(failed, dist::ReduceOp::SUM)->wait();
    if (!error.empty()) throw Error(error);
    FSDP_CHECK(failed.item() == 0,
               "[fsdp-train] the model does not fit in {} other rank(s)' memory (their errors "
               "give the numbers); pass --allow-oversubscribe-memory to try anyway",
               failed.item());
  }

  // The ceiling: on CPU the machine's sgemm peak on all its cores (measured by
  // rank 0 alone, so ranks do not compete for the cores while measuring), times
  // the number of machines; on CUDA each rank's GEMM peak in the compute dtype,
  // times the ranks.
  void measure_peak() {
    const int local = std::max(1, dist::world_info().local_size);
    Tensor peak_t = Tensor::zeros({1}, DType::f32);
    if (device.is_cuda()) {
      peak_t.fill_(profiler::device_gemm_peak_flops(device, mp.param_dtype.value_or(DType::f32)) /
                   1e9);
    } else if (main()) {
      peak_t.fill_(profiler::sgemm_peak_flops(peak_threads(), gemm_shapes()) / 1e9);
    }
    omp_set_num_threads(threads);
    Tensor peak_d = peak_t.to(device);
    pg->broadcast(peak_d, 0)->wait();
    peak_units = device.is_cuda() ? double(size) : double(size) / double(local);
    peak = peak_d.item() * 1e9 * peak_units;
    peak_measured = peak;
  }

  static int peak_threads() { return int(std::max(1u, std::thread::hardware_concurrency())); }

  // The model's GEMMs in one rank's forward (rows: its tokens), and the largest weight gradient.
  std::vector<profiler::GemmShape> gemm_shapes() const {
    const int64_t rows = cfg.batch * cfg.seq, d = cfg.dim, hd = cfg.resolved_head_dim();
    const int64_t f = cfg.resolved_ffn_hidden(), q = cfg.heads * hd;
    return {{rows, q + 2 * cfg.resolved_kv_heads() * hd, d},
            {rows, d, q},
            {rows, f, d},
            {rows, d, f},
            {rows, cfg.vocab, d},
            {f, d, rows}};
  }

  // A step that ran faster than the peak proves the peak low (measured while the machine was
  // busy, say): the peak is raised to the step's rate, here and (rank 0) in the cache, so MFU
  // never reads above 100%; the summary says so.
  void raise_peak(profiler::StepMetrics& m) {
    if (!(m.mfu > 1)) return;
    peak *= m.mfu;
    m.mfu = 1;
    if (!main()) return;
    if (device.is_cuda())
      profiler::raise_device_gemm_peak(device, mp.param_dtype.value_or(DType::f32),
                                       peak / peak_units);
    else
      profiler::raise_sgemm_peak(peak_threads(), peak / peak_units);
  }

  void print_config(int64_t persistent, int64_t persistent_measured) const {
    auto row = [](const std::string& k, const std::string& v) {
      fmt::print("| {:<22} | {:<44} |\n", k, v);
    };
    std::string dtypes;
    if (mp.param_dtype || mp.reduce_dtype)
      dtypes =
          fmt::format(" master, {} params, {} reduce", dtype_name(mp.param_dtype.value_or(dtype)),
                      dtype_name(mp.reduce_dtype.value_or(mp.param_dtype.value_or(dtype))));
    fmt::print("+{:-<24}+{:-<46}+\n", "", "");
    row("preset / arch", pretrained && pretrained->config
                             ? fmt::format("{} {} / {}", pretrained->format, pretrained->family,
                                           nn::arch_name(cfg.arch))
                             : fmt::format("{} / {}", o.preset, nn::arch_name(cfg.arch)));
    row("vocab / dim / layers", fmt::format("{} / {} / {}", cfg.vocab, cfg.dim, cfg.layers));
    row("heads / ffn hidden", fmt::format("{} / {}", cfg.heads, cfg.resolved_ffn_hidden()));
    if (cfg.resolved_kv_heads() != cfg.heads || cfg.resolved_head_dim() * cfg.heads != cfg.dim ||
        cfg.tie_embeddings || cfg.qkv_bias)
      row("kv heads / head dim",
          fmt::format("{} / {}{}{}", cfg.resolved_kv_heads(), cfg.resolved_head_dim(),
                      cfg.tie_embeddings ? ", tied head" : "", cfg.qkv_bias ? ", qkv bias" : ""));
    row("seq x batch",
        fmt::format("{} x {} x {} ranks x {} accum = {} tokens/step", cfg.seq, cfg.batch, size,
                    o.grad_accum, cfg.seq * cfg.batch * size * o.grad_accum));
    const int64_t nparams = model->num_parameters();
    row("parameters", fmt::format("{} ({:.2f} M)", nparams, double(nparams) / 1e6));
    row("dtype", std::string(dtype_name(dtype)) + dtypes);
    row("optimizer", fmt::format("AdamW lr {:g} betas ({:g}, {:g}) wd {:g}", o.lr, o.beta1, o.beta2,
                                 o.weight_decay));
    row("steps / seed", fmt::format("{} / {}", o.steps, o.seed));
    row("data", src->describe());
    row("tokenizer", tokenizer ? tokenizer->describe() : "none (random ids)");
    row("world size", fmt::format("{} ({}, {})", size, pg->backend(), dist::world_info().launcher));
    row("sharding", o.shard == "none"
                        ? std::string("none (DDP-style baseline)")
                        : fmt::format("fully_shard on {}{}", mesh->str(),
                                      o.reshard_after_forward ? "" : ", no reshard after forward"));
    if (o.activation_checkpoint != "none")
      row("activation ckpt", o.activation_checkpoint == "full"
                                 ? std::string("every block (recomputed in the backward)")
                                 : fmt::format("blocks 0, {0}, 2x{0}, ... (recomputed in the "
                                               "backward)",
                                               checkpoint_every_blocks(o.activation_checkpoint)));
    row("persistent mem / rank",
        fmt::format("{:.3f} MB formula, {:.3f} MB measured", double(persistent) / 1e6,
                    double(persistent_measured) / 1e6));
    row("peak mem plan / rank",
        fmt::format("{:.1f} MB{} at {}", double(plan.peak) / 1e6,
                    device.is_cpu() ? " resident" : "", plan.at));
    for (const MemoryTerm& t : plan.terms)
      row("  " + t.name, fmt::format("{:.1f} MB {}", double(t.bytes) / 1e6, t.what));
    row("  allocated at peak", fmt::format("{:.1f} MB (the allocator's own peak)",
                                           double(plan.peak_allocated) / 1e6));
    row("threads", std::to_string(threads));
    row("sgemm peak", fmt::format("{:.1f} GFLOP/s, all ranks (MFU denominator)", peak / 1e9));
    row("FLOPs / token", fmt::format("{:.3g}", cfg.flops_per_token()));
    fmt::print("+{:-<24}+{:-<46}+\n", "", "");
  }

  // The newest complete checkpoint, as checkpoint::Manager picks and loads it (newer incomplete
  // ones skipped aloud, every rank loaded before any goes on); then the run's data fields (seq,
  // data, tokenizer) must match the checkpoint's.
  void resume() {
    const std::vector<std::string> model_keys = {
        "arch",     "vocab",          "dim",      "layers", "heads", "ffn_hidden", "kv_heads",
        "head_dim", "tie_embeddings", "qkv_bias", "dtype"};
    const std::optional<checkpoint::Loaded> found =
        ckpt->load(*root, *opt, config_json, model_keys);
    if (!found) return;
    const checkpoint::Loaded& loaded = *found;
    const std::string& path = ckpt->loaded_path();
    const nlohmann::json saved = nlohmann::json::parse(loaded.config_json);
    check_same_data(saved, nlohmann::json::parse(config_json), path);
    std::string note;
    const int64_t windows = windows_read(loaded, saved, path, &note);
    start_step = loaded.step;
    if (!loaded.sealed)
      note += std::string(note.empty() ? "" : "; ") +
              "an older checkpoint (format 1): it has no complete.json, run id or shard "
              "identities to check; its files' checksums and chunks were checked; its run goes "
              "on under a new id";
    loader->set_position(windows);
    if (main()) {
      fmt::print("resume: loaded {} (step {}) of run {}; {} windows ({} tokens) read, continuing "
                 "at window {}{}\n",
                 path, start_step, loaded.run_id.empty() ? "(none recorded)" : loaded.run_id,
                 windows, windows * cfg.seq, windows,
                 note.empty() ? "" : " (" + note + ")");
      if (start_step >= o.steps)
        fmt::print(stderr,
                   "resume: the checkpoint is at step {} and --steps is {}: nothing left to "
                   "train; pass a larger --steps\n",
                   start_step, o.steps);
    }
  }

  // One optimizer step of grad_accum microbatches; returns its metrics, agreed over ranks. The
  // host waits for the device once: the metrics' gather (loss, grad norm, peak memory and the stop
  // agreement in one collective), before the optimizer may apply a non-finite update. Batches
  // reach the device from pinned memory, each prefetched while the one before it runs.
  profiler::StepMetrics step(int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t syncs0 = host_sync_count();
    opt->set_lr(schedule->at(step));
    const DataParallelModule::CommStats comm0 = parallel->comm_stats();
    parallel->zero_grad();
    std::vector<Tensor> micro_losses;  // on the device until the step line reads them
    for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
      // The gradients are reduced (reduce-scatter or all-reduce) in the last microbatch's backward.
      parallel->set_requires_gradient_sync(micro == o.grad_accum - 1);
      data::Batch b = loader->next();
      nn::LMLoss loss;  // the loss stays on the device; dlogits overwrite the logits
      micro_losses.push_back(loss.forward(model->forward(b.inputs), b.targets));
      model->backward(loss.backward(1.0 / double(o.grad_accum)));
      loader->prefetch();  // the next batch is made and copied while this one's kernels run
    }
    const DataParallelModule::CommStats comm1 = parallel->comm_stats();
    const optim::GradNorm norm =
        optim::clip_grad_norm_async(groups, o.clip, parallel->shard_group());
    // The step's one host sync: the loss, the grad norm (already all-reduced), peak memory and
    // the stop agreement (a signal reaches the ranks at different moments; all of them stop after
    // the same step), gathered over the ranks before the optimizer may apply a non-finite update.
    profiler::StepMetrics m =
        profiler::gather_step_metrics(*pg, device,
                                      {.step = step,
                                       .losses = micro_losses,
                                       .grad_norm_sq = norm.total_sq,
                                       .stop = stop_signal() != 0,
                                       .ckpt_write = ckpt ? ckpt->write_state() : 0,
                                       .lr = opt->lr(),
                                       .step_seconds = 1.0,
                                       .tokens = cfg.batch * size * cfg.seq * o.grad_accum,
                                       .flops_per_token = cfg.flops_per_token(),
                                       .peak_flops = peak});
    FSDP_CHECK(std::isfinite(m.loss) && std::isfinite(m.grad_norm),
               "[fsdp-train] step {}: loss {} and grad norm {} before the optimizer step; the "
               "weights were not updated and no checkpoint was written after the last good step. "
               "Lower --lr ({}) or set --grad-clip, and check the data",
               step, m.loss, m.grad_norm, opt->lr());
    opt->step();
    m.host_syncs = host_sync_count() - syncs0;
    const double dt = seconds_since(t0);
    m.step_seconds = dt;
    // A stop signal ends a wait stuck on a peer, but only after a step in flight had its time.
    longest_step = std::max(longest_step, dt);
    set_stop_grace(std::chrono::milliseconds(int64_t(1000.0 * std::max(1.0, 2.0 * longest_step))));
    m.tokens_per_s /= dt;  // gathered with a 1 s step
    m.mfu /= dt;
    raise_peak(m);
    if (step > start_step || o.steps == start_step + 1) {  // the first step warms up
      comm_total += comm1.comm_seconds - comm0.comm_seconds;
      exposed_total += comm1.exposed_seconds - comm0.exposed_seconds;
      step_total += dt;
      ++steps_timed;
    }
    return m;
  }

  // The mean loss of eval_batches validation batches, over all ranks.
  double evaluate() {
    const int64_t B = cfg.batch, T = cfg.seq;
    double sum = 0;
    for (int64_t e = 0; e < o.eval_batches; ++e) {
      data::Batch b = val->batch(e, B * size, rank * B, B, T);
      Tensor logits = model->forward(b.inputs.to(device)).view({B * T, cfg.vocab});
      sum += ops::cross_entropy_forward(logits, b.targets.to(device)).loss;
    }
    Tensor v = Tensor::full({1}, sum / double(o.eval_batches), DType::f64).to(device);
    pg->all_reduce(v, dist::ReduceOp::AVG)->wait();
    return v.item();
  }

  void save(int64_t step) {
    const Uninterruptible whole;  // a stop signal does not cut a checkpoint short (a second one does)
    const auto tc = std::chrono::steady_clock::now();
    if (main()) fmt::print("checkpoint: writing step {} to {} ...\n", step, o.ckpt_dir);
    checkpoint::Extras extras;  // its run id is the Manager's (the run's lineage)
    // The windows read over all ranks: a resume at any batch size or world size goes on from the
    // next one (checkpoints before saved the batch index).
    extras.data_position = loader->position();
    extras.user_json = nlohmann::json{{"data",
                                       {{"windows", loader->position()},
                                        {"tokens", loader->position() * cfg.seq}}}}
                           .dump();
    if (tokenizer) extras.files.emplace_back("tokenizer.json", tokenizer->json());
    if (tokenizer && model_tokenizer)  // the pretrained model's ids, chat template, pre-tokenizer
      extras.files.emplace_back("tokenizer_meta.json", pretrained->tokenizer_meta().to_json());
    if (main() && ckpt->pending_step() >= 0)  // a second save waits for the first
      fmt::print("checkpoint: waiting for the background write of step {}\n", ckpt->pending_step());
    ckpt->save(step, *root, *opt, config_json, extras);
    if (main() && o.async_checkpoint)
      fmt::print("checkpoint: step {} copied in {:.3f} s (training blocked {:.3f} s); writing in "
                 "the background\n",
                 step, seconds_since(tc), ckpt->last_blocking_seconds());
    else if (main())
      fmt::print("checkpoint: done in {:.2f} s\n", seconds_since(tc));
  }

  // Collective: --async-checkpoint's pending save, committed (or its failure thrown on every rank).
  void finish_async_save() {
    if (!ckpt || ckpt->pending_step() < 0) return;
    const Uninterruptible whole;
    const int64_t step = ckpt->pending_step();
    const auto tc = std::chrono::steady_clock::now();
    ckpt->wait();
    if (main())
      fmt::print("checkpoint: step {} written in the background (committed after {:.3f} s more)\n",
                 step, seconds_since(tc));
  }

  // Means over the steps after the first; communication as rank 0 saw it.
  void print_summary() {
    const double n = double(std::max<int64_t>(1, steps_timed));
    Tensor peak_mem = Tensor::full({2}, double(memory_stats(device).peak), DType::f64);
    peak_mem.data<double>()[1] = double(peak_resident_bytes());
    peak_mem = peak_mem.to(device);
    Tensor peaks = Tensor::empty({2 * size}, DType::f64, device);
    pg->all_gather_into_tensor(peaks, peak_mem)->wait();
    const auto pv = peaks.to_f64_vector();
    if (!main()) return;
    std::string rss;  // each rank's peak resident memory (VmHWM), MB
    double peak_alloc = 0;
    for (int r = 0; r < size; ++r) {
      peak_alloc = std::max(peak_alloc, pv[size_t(2 * r)]);
      rss += fmt::format("{}{:.0f}", r ? "/" : "", pv[size_t(2 * r + 1)] / 1e6);
    }
    fmt::print("summary | step {:.1f} ms | peak mem {:.1f} MB | peak rss {} MB",
               1e3 * step_total / n, peak_alloc / 1e6, rss);
    // The plan is rank 0's: against rank 0's resident peak (CPU) or its allocator's (CUDA).
    const double measured = device.is_cpu() ? pv[1] : pv[0];
    fmt::print(" | plan {:.1f} MB{} (measured/plan {:.3f}), {:.1f} MB allocated ({:.3f})",
               double(plan.peak) / 1e6, device.is_cpu() ? " resident" : "",
               measured / double(std::max<int64_t>(1, plan.peak)), double(plan.peak_allocated) / 1e6,
               pv[0] / double(std::max<int64_t>(1, plan.peak_allocated)));
    if (size > 1)
      fmt::print(" | comm {:.1f} ms/step in collectives, {:.1f} ms/step exposed ({:.0f}%)",
                 1e3 * comm_total / n, 1e3 * exposed_total / n,
                 comm_total > 0 ? 100.0 * std::min(1.0, exposed_total / comm_total) : 0.0);
    fmt::print("\n");
    if (peak > peak_measured)
      fmt::print(
          "peak | raised from {:.1f} to {:.1f} GFLOP/s (all ranks) by a step's observed "
          "rate, cached in {}; MFU is against it\n",
          peak_measured / 1e9, peak / 1e9,
          device.is_cuda() ? profiler::device_gemm_peak_cache_path()
                           : profiler::sgemm_peak_cache_path());
  }

  // Every rank samples in lockstep (sharded forwards are collective); rank 0 prints.
  void print_sample() {
    const std::vector<int32_t> ids = nn::sample(*model, tokenizer->encode(o.prompt),
                                                {.tokens = o.sample_tokens,
                                                 .temperature = o.temperature,
                                                 .max_id = tokenizer->size(),
                                                 .seed = o.seed,
                                                 .device = device,
                                                 .stop_id = tokenizer->eos_id(),
                                                 .on_token = nullptr});
    std::string text = tokenizer->decode(ids);
    for (char& ch : text)
      if (static_cast<unsigned char>(ch) < 32 && ch != '\n') ch = ' ';
    if (main()) fmt::print("sample: {}{}\n", o.prompt, text);
  }

  void fit() {
    ProfileWindow profile(o.profile_steps, o.profile_dir, rank, device);
    steps_done = start_step;
    for (int64_t s = start_step; s < o.steps; ++s) {
      profile.at_step(s);
      profiler::StepMetrics m = step(s);
      if (main()) {
        fmt::print("{}\n", m.line());
        std::fflush(stdout);
      }
      // The background write's outcome came with the metrics, the same on every rank: a failure
      // is an error here, on every rank; a finished write is committed.
      if (ckpt && ckpt->pending_step() >= 0 && (m.ckpt_write_failed || !m.ckpt_writing))
        finish_async_save();
      if (val && o.eval_every > 0 && ((s + 1) % o.eval_every == 0 || s + 1 == o.steps)) {
        m.val_loss = evaluate();
        if (main()) fmt::print("step {} | val loss {:.4f}\n", s, *m.val_loss);
      }
      if (log.is_open()) {
        log << m.json() << "\n";
        log.flush();
        const int err = errno;
        FSDP_CHECK(log.good(),
                   "[fsdp-train] writing --log-file '{}' failed at step {}: {}; stopping rather "
                   "than training on without the log",
                   o.log_file, s, std::strerror(err));
      }
      const bool saved = o.ckpt_every > 0 && ((s + 1) % o.ckpt_every == 0 || s + 1 == o.steps);
      if (saved) save(s + 1);
      steps_done = s + 1;
      if (s + 1 < o.steps && m.stop) {
        const Uninterruptible stopping;  // the checkpoint and the summary's gather
        const int sig = stop_signal();
        if (!o.ckpt_dir.empty() && !saved) save(s + 1);
        if (main() && ckpt && ckpt->pending_step() >= 0)
          fmt::print(stderr, "fsdp-train: stopping: waiting for the background write of step {}\n",
                     ckpt->pending_step());
        finish_async_save();  // the write in flight is committed before the process ends
        if (main())
          fmt::print(stderr, "fsdp-train: {} received: stopped after step {}{}\n",
                     sig == SIGINT    ? "SIGINT"
                     : sig == SIGTERM ? "SIGTERM"
                                      : "a stop signal",
                     s,
                     o.ckpt_dir.empty()
                         ? " (no --ckpt-dir: nothing saved)"
                         : fmt::format("; checkpoint of step {} in {}; continue with --resume",
                                       s + 1, o.ckpt_dir));
        break;
      }
    }
    finish_async_save();
    profile.finish();
    if (o.steps > 0) print_summary();
    if (!o.data.empty() && o.sample_tokens > 0 && steps_done == o.steps) print_sample();
  }
};

Trainer::Trainer(const TrainOptions& options, std::shared_ptr<dist::ProcessGroup> pg)
    : impl_(std::make_unique<Impl>(options, std::move(pg))) {}
Trainer::~Trainer() = default;
void Trainer::fit() { impl_->fit(); }
int64_t Trainer::start_step() const { return impl_->start_step; }
int64_t Trainer::steps_done() const { return impl_->steps_done; }
nn::MiniLLM& Trainer::model() { return *impl_->model; }

}  // namespace fsdp::train
