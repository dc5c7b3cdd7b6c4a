// Trainer::Impl's setup: options checked, the parts not handed in (trainer_parts.cpp), the mesh,
// the tokenizer and the data (trainer_data.cpp), the model (fully_shard or replicate) and its optimizer, from the
// TrainerParts factory.
#include <fcntl.h>
#include <fmt/core.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/manager.h"
#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/core/allocator.h"
#include "fsdp/core/file.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/fsdp/replicate.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/profiler/tensorboard.h"
#include "fsdp/train/memory_plan.h"
#include "fsdp/train/preference.h"
#include "src/core/json_read.h"
#include "src/train/trainer_impl.h"

namespace fsdp::train {

namespace {

// Default threads: this rank's share of the cores it may run on (mpirun binds
// each rank to a core unless told --bind-to none).
int rank_threads(int requested, int local_size) {
  if (requested > 0) return requested;
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t mask;
  const int allowed = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : hw;
  return std::max(1, std::min(allowed, hw / std::max(1, local_size)));
}

// An output folder this run will write: created, and a file written and removed in it now,
// so a folder that cannot be written is refused at the start, naming the system's reason, not
// at the first save N steps in.
void check_writable_dir(const std::string& dir, const char* flag, int rank) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  FSDP_CHECK(!ec, "[fsdp-train] {} '{}' cannot be created: {}", flag, dir, ec.message());
  const fs::path probe = fs::path(dir) / fmt::format(".fsdp_write_test_rank{}", rank);
  // O_NOFOLLOW: a link planted at the probe's name is refused, never truncated through.
  ::close(open_for_write(probe.string(), O_WRONLY | O_CREAT | O_TRUNC,
                         fmt::format("[fsdp-train] {} '{}': the write probe", flag, dir)));
  fs::remove(probe, ec);
}

// A --ckpt-dir equal to the --init-from model folder or inside it: its .lock and step folders
// would join the model's files (and the base's identity, so every resume was refused as "base
// changed"). Refused by name before anything is written there.
void check_ckpt_dir_outside_model(const std::string& ckpt_dir, const std::string& init_from) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (init_from.empty() || !fs::is_directory(init_from, ec)) return;
  const fs::path model = fs::canonical(init_from, ec);
  if (ec) return;
  fs::path ckpt = fs::weakly_canonical(fs::absolute(ckpt_dir), ec).lexically_normal();
  if (ec) return;
  while (!ckpt.has_filename() && ckpt.has_relative_path()) ckpt = ckpt.parent_path();
  const fs::path rel = ckpt.lexically_relative(model);
  FSDP_CHECK(rel.empty() || *rel.begin() == "..",
             "[fsdp-train] --ckpt-dir '{}' is {}the --init-from model folder '{}': its .lock and "
             "step folders would be written among the model's files (and change the base a "
             "resume checks); choose a folder outside it",
             ckpt_dir, rel == "." ? "" : "inside ", init_from);
}

// --init-from a pretrained model: the architecture is the model's. A model-shape flag that says
// otherwise is refused by name; flags not given take the model's values; seq and batch are the
// run's (flags, else the preset's).
nn::TransformerConfig config_from_model(const TrainOptions& o, const checkpoint::Pretrained& pre) {
  nn::TransformerConfig c = *pre.config;
  auto check = [&](const char* flag, const auto& given, const auto& model) {
    if (given)
      FSDP_CHECK(*given == model,
                 "[fsdp-train] {} {} contradicts the model: {} has {} (the architecture comes "
                 "from --init-from; drop the flag or give the model's value)",
                 flag, *given, pre.path, model);
  };
  std::optional<std::string> arch;
  if (o.model.arch) arch = nn::arch_name(*o.model.arch);
  check("--arch", arch, nn::arch_name(c.arch));
  check("--vocab", o.model.vocab, c.vocab);
  check("--dim", o.model.dim, c.dim);
  check("--layers", o.model.layers, c.layers);
  check("--heads", o.model.heads, c.heads);
  check("--ffn-hidden", o.model.ffn_hidden, c.resolved_ffn_hidden());
  check("--kv-heads", o.model.kv_heads, c.resolved_kv_heads());
  check("--head-dim", o.model.head_dim, c.resolved_head_dim());
  check("--rope-theta", o.model.rope_theta, c.rope_theta);
  FSDP_CHECK(!o.model.tie_embeddings || c.tie_embeddings,
             "[fsdp-train] --tie-embeddings contradicts the model: {} has an untied head",
             pre.path);
  FSDP_CHECK(!o.model.qkv_bias || c.qkv_bias,
             "[fsdp-train] --qkv-bias contradicts the model: {} has no q/k/v biases", pre.path);
  FSDP_CHECK(!o.model.qk_norm || c.qk_norm,
             "[fsdp-train] --qk-norm contradicts the model: {} has no q/k norms", pre.path);
  for (const auto& [flag, given, has] :
       {std::tuple<const char*, bool, bool>{"--norm-plus-one", o.model.norm_plus_one,
                                            c.norm_plus_one},
        {"--sandwich-norms", o.model.sandwich_norms, c.sandwich_norms},
        {"--geglu", o.model.geglu, c.geglu},
        {"--embed-scale", o.model.embed_scale, c.embed_scale}})
    FSDP_CHECK(!given || has, "[fsdp-train] {} contradicts the model: {} has none", flag, pre.path);
  check("--sliding-window", o.model.sliding_window, c.sliding_window);
  check("--global-every", o.model.global_every, c.global_every);
  check("--rope-local-theta", o.model.rope_local_theta, c.rope_local_theta);
  const nn::TransformerConfig preset = nn::TransformerConfig::preset(o.model.preset);
  c.seq = o.model.seq.value_or(preset.seq);
  c.batch = o.model.batch.value_or(preset.batch);
  c.lora = o.lora_config(c.arch, c.moe.enabled());  // the run's adapters on the model's weights
  c.validate();
  return c;
}

}  // namespace

Trainer::Impl::Impl(const TrainOptions& options, std::shared_ptr<dist::ProcessGroup> group,
                    TrainerParts given)
    : o(options),
      pretrained(options.model.init_from.empty() ? nullptr : [&] {
        auto p = std::make_shared<checkpoint::Pretrained>(
            checkpoint::load_pretrained(options.model.init_from));
        if (!options.data.chat_template.empty())
          checkpoint::set_chat_template(*p, options.data.chat_template);
        return std::shared_ptr<const checkpoint::Pretrained>(std::move(p));
      }()),
      // Named (its family's key in the run's checkpoints), whether a pretrained model's or the
      // flags' (a preset with the options of one family; models::named_config says which stay
      // unnamed).
      cfg(models::named_config(pretrained && pretrained->config
                                   ? config_from_model(options, *pretrained)
                                   : options.model_config())),
      family(&models::spec_to_train(cfg)),
      pg(std::move(group)),
      parts(std::move(given)) {
  o.validate();
  fill_parts();
  FSDP_CHECK(o.run.device.type == pg->device().type,
             "[fsdp-train] the options' device is {} but the process group's is {}: the run is on "
             "the process group's device (init_process_group's .device); set both alike",
             o.run.device.str(), pg->device().str());
  rank = pg->rank();
  if (!o.checkpoint.ckpt_dir.empty()) {
    // Where the folder is, before anything (the write probe included) is written there.
    check_ckpt_dir_outside_model(o.checkpoint.ckpt_dir, o.model.init_from);
    checkpoint::check_folder_place(o.checkpoint.ckpt_dir);
    check_writable_dir(o.checkpoint.ckpt_dir, "--ckpt-dir", pg->rank());
    ckpt = std::make_unique<checkpoint::Manager>(
        checkpoint::ManagerOptions{.dir = o.checkpoint.ckpt_dir,
                                   .resume = o.checkpoint.resume,
                                   .overwrite = o.checkpoint.overwrite,
                                   .keep = o.checkpoint.keep,
                                   .async = o.checkpoint.async_checkpoint},
        pg);
  }
  if (!o.profile.profile_steps.empty())
    check_writable_dir(o.profile.profile_dir, "--profile-dir", pg->rank());
  size = pg->size();
  device = pg->device();
  dtype = o.sharding.dtype;
  FSDP_CHECK(device.is_cpu() || dtype == DType::f32,
             "[fsdp-train] --dtype {} on CUDA: the kernels take f32 (master) "
             "with --param-dtype bf16 or f16",
             dtype_name(dtype));
  mp.param_dtype = o.sharding.param_dtype;
  mp.reduce_dtype = o.sharding.reduce_dtype;
  if (cfg.lora.enabled() && dtype_size(dtype) == 2) {
    // A half-precision base beside f32 adapters: the base is stored, gathered and computed in
    // --dtype; the adapters keep f32 masters, AdamW state and gradients (computed in --dtype).
    frozen_dtype = dtype;
    dtype = DType::f32;
    if (!mp.param_dtype) mp.param_dtype = frozen_dtype;
    if (!mp.reduce_dtype) mp.reduce_dtype = DType::f32;
  }
  if (o.model.base_quant == "keep") {
    FSDP_CHECK(pretrained && pretrained->format == "gguf",
               "[fsdp-train] --base-quant keep keeps a GGUF's quantized blocks, and --init-from "
               "{} is {}",
               o.model.init_from, pretrained ? pretrained->format : "none");
    frozen_packed = [pre = pretrained, c = cfg](const std::string& name) {
      return pre->packed_rows(c, name);
    };
  }
  // Mesh: all ranks shard, or hsdp replica groups of size/hsdp ranks each.
  if (o.sharding.hsdp > 0) {
    FSDP_CHECK(size % o.sharding.hsdp == 0,
               "[fsdp-train] --hsdp {} does not divide the world size {}", o.sharding.hsdp, size);
    mesh =
        dist::init_device_mesh({o.sharding.hsdp, size / o.sharding.hsdp}, {"replicate", "shard"});
  } else {
    mesh = dist::init_device_mesh({size},
                                  {o.sharding.shard == ShardMode::none ? "replicate" : "shard"});
  }
  if (const int64_t ep = o.sharding.expert_parallel; ep > 1) {
    FSDP_CHECK(cfg.moe.enabled(),
               "[fsdp-train] --expert-parallel {} splits a mixture of experts' experts, and the "
               "model is dense (no MoE layer)",
               ep);
    FSDP_CHECK(size % ep == 0, "[fsdp-train] --expert-parallel {} does not divide the world size {}",
               ep, size);
    FSDP_CHECK(cfg.moe.experts % ep == 0,
               "[fsdp-train] --expert-parallel {} does not divide the model's {} experts", ep,
               cfg.moe.experts);
    expert_mesh = dist::init_expert_mesh(ep);
  }
  threads = rank_threads(o.run.threads, dist::world_info().local_size);
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
  precompute_reference();  // --pref-precompute-ref: before a resume loads the trained weights
  // The run's config, saved in checkpoints; its model keys must match on resume.
  nlohmann::json run_config = nlohmann::json::parse(cfg.to_json());
  // Paths (a Linux file name may hold any byte) escaped where not UTF-8, as JSON must.
  const std::string tokenizer_name = tokenizer ? tokenizer->describe() : "none";
  run_config.update({{"batch", cfg.batch},
                     {"seq", cfg.seq},
                     {"world_size", size},
                     {"seed", o.run.seed},
                     {"dtype", std::string(dtype_name(o.sharding.dtype))},
                     {"lr", o.optimizer.lr},
                     {"data", json_read::utf8_safe(o.data.data)},
                     {"tokenizer", json_read::utf8_safe(tokenizer_name)},
                     {"tokenizer_hash", tokenizer ? tokenizer->hash() : ""}});
  if (!o.data.data.empty()) {  // the data by content (a resume checks it), and the stream's length
    run_config["data_content"] = data::data_identity(o.data.data).str();
    if (const auto* s = dynamic_cast<const data::TokenStream*>(src.get()))
      run_config["data_tokens"] = s->size();
    // A checkpoint's position counts samples, or packed rows: a resume must read the same ones.
    if (const auto* s = dynamic_cast<const data::SampleSource*>(src.get()))
      run_config["data_samples"] = s->size();
    if (const auto* s = dynamic_cast<const data::PackedSource*>(src.get())) {
      run_config["pack"] = true;
      run_config["data_rows"] = s->rows();
    }
  }
  if (cfg.lora.enabled()) {  // the frozen base, which checkpoints leave out: by path and content
    run_config["base"] = json_read::utf8_safe(o.model.init_from);
    run_config["base_content"] = o.model.init_from.empty()
                                     ? fmt::format("initialised from seed {}", o.run.seed)
                                     : checkpoint::model_identity(o.model.init_from);
  }
  run_config["flags"] = nlohmann::json::parse(flags_json(o));  // what a resume reports as changed
  config_json = run_config.dump();
  loader = std::make_unique<data::DataLoader>(src, cfg.batch * size, rank, size, cfg.seq, device);
  if (o.checkpoint.resume) resume();
  if (main() && !o.profile.log_file.empty()) {
    // A link or a FIFO at the log's name is refused by name (never written through, never
    // waited on); then the stream opens the regular file that is there.
    ::close(open_for_write(o.profile.log_file, O_WRONLY | O_CREAT, "[fsdp-train] --log-file"));
    log.open(o.profile.log_file, start_step > 0 ? std::ios::app : std::ios::trunc);
    const int err = errno;
    FSDP_CHECK(log.good(), "[fsdp-train] cannot write --log-file '{}': {}", o.profile.log_file,
               std::strerror(err));
  }
  if (main() && !o.profile.tensorboard.empty()) {  // a new event file per start, as TensorBoard's
    tensorboard = std::make_unique<profiler::EventWriter>(o.profile.tensorboard);
    tensorboard->session_start(start_step);
    tensorboard->text("config", start_step,
                      "```\n" + nlohmann::json::parse(config_json).dump(2) + "\n```");
    tensorboard->flush();
  }
}

// The preference reference of dpo and ipo as a model of its own (TRL's ref_model): another model
// (--pref-reference: a Hugging Face folder or a GGUF of the policy's shape and vocab), or, for a full
// fine-tune, a copy of the initial model. Built and sharded as the policy is, frozen (no gradients,
// no optimizer state). Under LoRA with no --pref-reference, the reference is the policy with its
// adapters off, and nothing is built. With --pref-precompute-ref, none is kept for training: the
// pass before it (precompute_reference) builds --pref-reference's for itself and frees it.
PreferenceLoss* Trainer::Impl::separate_reference_loss() {
  auto* pref = dynamic_cast<PreferenceLoss*>(parts.loss.get());
  const bool separate = pref && pref->needs_reference() && !pref->precomputed() &&
                        (!cfg.lora.enabled() || !o.preference.pref_reference.empty());
  return separate ? pref : nullptr;
}

void Trainer::Impl::build_reference(PreferenceLoss* pref) {
  const std::string& path = o.preference.pref_reference;
  if (!pref) return;
  nn::TransformerConfig rc = cfg;
  rc.lora = {};  // the reference has no adapters
  std::optional<checkpoint::Pretrained> other;
  if (!path.empty()) {
    other = checkpoint::load_pretrained(path);
    FSDP_CHECK(other->config.has_value(),
               "[fsdp-train] --pref-reference {}: the file does not say its architecture; give a "
               "Hugging Face folder or a GGUF",
               path);
    nn::TransformerConfig want = *other->config;
    want.seq = rc.seq, want.batch = rc.batch, want.lora = {};
    FSDP_CHECK(want.to_json() == rc.to_json(),
               "[fsdp-train] --pref-reference {}: its shape differs from the trained model's; the "
               "reference must be of the same family, shape and vocab ({} against {})",
               path, want.to_json(), rc.to_json());
  }
  reference = family->build(rc);
  for (auto& [name, p] : reference->named_parameters()) p->requires_grad = false;
  const models::Parallelized p = family->parallelize(
      *reference, {.mesh = mesh,
                   .replicate = false,
                   .fsdp = {.reshard_after_forward = true,
                            .mp_policy = mp,
                            .init_dtype = dtype,
                            .seed = o.run.seed,
                            .frozen_dtype = frozen_dtype,
                            .frozen_packed = frozen_packed},
                   .checkpoint_every = 0,
                   .expert_mesh = expert_mesh});
  if (const checkpoint::Pretrained* from = other ? &*other : pretrained.get()) {
    from->load_into(*reference, p.root);
    from->release_file_pages();
  }
  pref->set_reference_model(reference.get());
}

void Trainer::Impl::build_model() {
  // The router's loss reaches the step through the fused loss alone (nn::Transformer's backward
  // refuses the logits' gradient without it): refused here, before anything is built.
  FSDP_CHECK(!cfg.moe.enabled() || (cfg.moe.aux_coef == 0 && cfg.moe.z_coef == 0) ||
                 (o.sharding.fused_loss && o.preference.preference.empty()),
             "[fsdp-train] the model's router loss (moe aux coefficient {}, z coefficient {}: "
             "config.json's router_aux_loss_coef with output_router_logits true) is added by the "
             "fused loss only, which {} leaves out; train without it (output_router_logits false "
             "in the model's config.json) or {}",
             cfg.moe.aux_coef, cfg.moe.z_coef,
             o.preference.preference.empty() ? "--fused-loss false" : "--preference (it needs the logits)",
             o.preference.preference.empty() ? "with the fused loss" : "without --preference");
  check_memory_plan();  // from the shapes alone, before any module or tensor exists
  model = family->build(cfg);
  // fully_shard on each block and the root, or replicate(); then activation checkpointing.
  const models::Parallelized p = family->parallelize(
      *model, {.mesh = mesh,
               .replicate = o.sharding.shard == ShardMode::none,
               .fsdp = {.reshard_after_forward = o.sharding.reshard_after_forward,
                        .mp_policy = mp,
                        .init_dtype = dtype,
                        .seed = o.run.seed,
                        .frozen_dtype = frozen_dtype,
                        .frozen_packed = frozen_packed},
               .checkpoint_every = o.sharding.activation_checkpoint.every,
               .expert_mesh = expert_mesh});
  parallel = p.parallel;
  root = p.root;
  // The router loss of an MoE over the global batch's statistics (2E + 2 sums, one host
  // all-reduce per forward), so that every world size computes np 1's loss and gradients.
  if (!model->moe_layers().empty() && size > 1)
    model->set_router_reduce(
        [group = pg](std::vector<double>& v) {
          Tensor t = Tensor::from_vector(v, {int64_t(v.size())});
          group->all_reduce(t, dist::ReduceOp::SUM)->wait();
          v = t.to_f64_vector();
        },
        size);
  // --init-from: sharded, each rank reads only its own rows of each parameter into its shards;
  // replicated (no root), every rank reads them whole.
  if (pretrained) {
    pretrained->load_into(*model, root);
    pretrained->release_file_pages();  // the file's pages the load read are not held on
  }
  build_reference(separate_reference_loss());
  groups = parallel->param_groups(o.optimizer.weight_decay, !o.optimizer.wd_2d_only);
  opt = parts.optimizer(groups);
  FSDP_CHECK(opt != nullptr, "[fsdp-train] TrainerParts::optimizer made no optimizer");
}

}  // namespace fsdp::train
