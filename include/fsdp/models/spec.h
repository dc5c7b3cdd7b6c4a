// Model families as specs, one folder each (src/models/<family>/), in the way of torchtitan's
// TrainSpec registry: what the family is to Hugging Face and to llama.cpp, its config.json both
// ways and its GGUF header read, which of our configs are its, how it is built and parallelized,
// the config keys a resume must match and its GEMM shapes, and its state-dict adapter (its names in
// Hugging Face's and llama.cpp's files). The trainer, the checkpoint layer's readers and exports
// and fsdp-generate look a family up here and name none.
//
//   const models::ModelSpec& spec = models::spec_of(cfg);          // the family of a config
//   auto model = spec.build(cfg);
//   models::Parallelized p = spec.parallelize(*model, {.mesh = mesh, .fsdp = {.seed = 1}});
//
// Every family builds the generic decoder, nn::Transformer, with its blocks: llama's relatives
// nn::TransformerBlock, whose options hold what each adds (q/k/v biases for qwen2, QK-norm for
// qwen3, Gemma 3's norms, GeGLU and sliding windows); a newer family its own block, composed from
// nn's layers in its folder, with its own options, a struct of its folder saved under its name in
// the config JSON (olmo2). A layer capability nn lacks is added to nn's layer, not to the family.
//
// Adding a family: a folder src/models/<family>/ with spec.cpp defining
// fsdp::models::<family>::spec and its adapter (llama's relatives: llama::relative_adapter in
// src/models/llama/names.h), its line in FSDP_MODEL_FAMILIES (src/models/registry.cpp), and its
// files in CMakeLists.txt's sources (docs/architecture.md's checklist).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/distributed/device_mesh.h"
#include "fsdp/fsdp/data_parallel.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/models/state_dict_adapter.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/profiler/ceilings.h"

namespace fsdp::models {

// How a model is spread over the ranks: FSDP2's recipe (fully_shard on each block, then on the
// root) or replicate() (the DDP baseline), then activation checkpointing on its blocks.
struct Parallelism {
  std::shared_ptr<dist::DeviceMesh> mesh;  // null: one dimension over the initialised world
  bool replicate = false;  // false: fully_shard; true: every rank holds all of it
  FullyShardOptions fsdp;  // fully_shard's, each block's and the root's; replicate: its init_dtype
                           // and seed
  int64_t checkpoint_every = 0;  // > 0: blocks 0, N, 2N, ... recompute in the backward
  // Expert parallel (dist::init_expert_mesh's dp_shard_mod_ep x ep mesh; null: none): every MoE
  // layer splits its experts over the "ep" group and its experts are fully_shard'ed over
  // "dp_shard_mod_ep", their gradients divided by the world size; fully_shard only.
  std::shared_ptr<dist::DeviceMesh> expert_mesh;
};

struct Parallelized {
  DataParallelModule* parallel = nullptr;  // the step's interface: the root, or replicate's
  FSDPModule* root = nullptr;              // fully_shard: the sharded root (checkpoints)
};

// A GGUF file's header, as a family reads its config from it (checkpoint::load_pretrained puts a
// GgufFile behind it). Each getter throws, naming the file and the key or tensor, where it is
// absent (without a fallback) or of another type.
class GgufHeader {
 public:
  virtual ~GgufHeader() = default;
  virtual const std::string& path() const = 0;
  virtual bool has(const std::string& key) const = 0;
  virtual int64_t get_int(const std::string& key) const = 0;
  virtual int64_t get_int(const std::string& key, int64_t fallback) const = 0;
  virtual double get_float(const std::string& key, double fallback) const = 0;
  virtual std::string get_string(const std::string& key, const std::string& fallback) const = 0;
  virtual int64_t array_size(const std::string& key) const = 0;  // a string array's length
  virtual bool contains(const std::string& tensor) const = 0;
  virtual std::vector<int64_t> tensor_ne(const std::string& tensor) const = 0;  // ne[0] innermost
  virtual std::vector<double> read_f64(
      const std::string& tensor) const = 0;  // a small one's values
};

struct ModelSpec {
  std::string_view name;  // the family: seed, llama, qwen2, qwen3, gemma3, mistral, qwen3_moe, mixtral
  std::string_view what;
  nn::Arch arch;  // the module tree's form: the seed's or llama's (the config JSON's "arch")
  // Hugging Face: config.json's model_type and the class ("" for none: no Hugging Face export).
  std::string_view hf_model_type, hf_class;
  // Its state-dict adapter: its parameters' Hugging Face and GGUF names, llama.cpp's architecture
  // and what its converter does (state_dict_adapter.h). Null: only our own names (seed).
  const StateDictAdapter* adapter = nullptr;
  // Whether a config is this family's: for a config that names it (its "family"), whether it
  // holds the config's options (refusing its own options' bad fields by name); for a config
  // without the key (written before it), by its options alone (spec_of asks each family). A
  // family newer than the key (olmo2) holds only configs that name it.
  bool (*matches)(const nn::TransformerConfig& config);
  // config.json's text -> our config, validated; refuses, naming `where` and the field, what the
  // family's model here cannot hold. Null where hf_model_type is "".
  nn::TransformerConfig (*read_hf_config)(const std::string& text, const std::string& where);
  // Our config -> config.json's model fields (a JSON object's text; the caller adds the dtype and
  // the token ids). Null where hf_class is "".
  std::string (*write_hf_config)(const nn::TransformerConfig& config);
  // A GGUF header of architecture gguf_arch -> our config, validated (llama.cpp's constants for
  // what the file does not say); refuses, naming the file and the key, what the model here cannot
  // hold. Null: the family's GGUF files are not read.
  nn::TransformerConfig (*read_gguf_config)(const GgufHeader& header);
  // Refuses, by name, a config of this family that llama.cpp's architecture would compute as
  // another model (its constants differ). Null: every config of the family exports.
  void (*check_gguf)(const nn::TransformerConfig& config);
  // Training: the module tree, its parallelization, the config keys that a checkpoint and the run
  // resuming it must agree on, and the GEMMs of one rank's forward (rows: its tokens) with its
  // largest weight gradient (the ceiling's shapes).
  std::unique_ptr<nn::Transformer> (*build)(const nn::TransformerConfig& config);
  Parallelized (*parallelize)(nn::Transformer& model, const Parallelism& p);
  std::span<const std::string_view> shape_keys;
  std::vector<profiler::GemmShape> (*gemm_shapes)(const nn::TransformerConfig& config);
  // Its parameters' element count from the config alone, for a family whose blocks are its own;
  // null: nn::TransformerConfig::num_parameters (nn::TransformerBlock's). models::num_parameters.
  int64_t (*num_parameters)(const nn::TransformerConfig& config) = nullptr;
  // Its own block, for nn::Transformer(config) (nn::family_blocks); null: nn::default_block.
  std::unique_ptr<nn::Module> (*block)(const nn::TransformerConfig& config, int64_t layer) = nullptr;
};

// Every family, in registry order.
std::span<const ModelSpec* const> model_specs();
// The family a config belongs to: the one its "family" names (refused by name when there is none
// such, or when the config holds options that are not that family's), else, for a config written
// before families named themselves, the one whose `matches` holds it; refuses, naming the options,
// a config no family holds (some of Gemma's options but not all, QK-norm beside q/k/v biases).
const ModelSpec& spec_of(const nn::TransformerConfig& config);
// The config with its family's name (config.family, the config JSON's "family" key, which
// checkpoints and exports then carry): for a config that names none (one a family's reader or a
// preset built, or one written before families named themselves), the family whose `matches`
// holds it; unchanged where it names one, or where no family holds its options (an experiment,
// which spec_to_train trains as its form's family, unnamed as before), and for the seed's form,
// whose family's name is a run config's "seed" key (the run's random seed).
nn::TransformerConfig named_config(nn::TransformerConfig config);
// The family that trains a config: spec_of's, or for a mix of options no family holds (an
// experiment: GeGLU on llama), the family of its form (seed or llama), which builds, parallelizes
// and resumes it alike; such a model has no Hugging Face or GGUF export.
const ModelSpec& spec_to_train(const nn::TransformerConfig& config);
// The element count of the parameters of the model spec_to_train(config) builds, from the config
// alone (the spec's num_parameters, else the config's own).
int64_t num_parameters(const nn::TransformerConfig& config);
// The family of a config.json's model_type; null when none has it.
const ModelSpec* spec_for_hf_model_type(std::string_view model_type);
// The family whose GGUF files have general.architecture `arch` (its adapter's); null when none.
const ModelSpec* spec_for_gguf_arch(std::string_view arch);
// The adapter of the family that trains a config (spec_to_train's); refuses, naming the family,
// one with only our own names (seed). `what` begins the message: "[export] a PEFT adapter".
const StateDictAdapter& adapter_of(const nn::TransformerConfig& config, std::string_view what);
// The llama.cpp architectures of every family whose GGUF files are read, ", "-joined.
std::string gguf_archs();
// The family whose name is `name`; null when none.
const ModelSpec* spec_named(std::string_view name);
// The model_types of every family with a Hugging Face class, ", "-joined (for messages).
std::string hf_model_types();

}  // namespace fsdp::models
