// nn::Transformer, the generic decoder every model family builds (fsdp/models/spec.h): embedding,
// N blocks, [final norm], head (untied, or tied to the embedding). The blocks are the
// family's (a BlockFactory: OLMo-2's is its own module, src/models/olmo2/); by default they are
// nn::TransformerBlock driven by this config's options, which llama's relatives set.
//
// Two forms (Arch):
//   seed     the reference script's model, exactly: bidirectional
//            nn.MultiheadAttention (packed in-projection with bias, out-projection
//            with bias, no positions), FFN Linear-SiLU-Linear without bias, no
//            final norm. Parameter names are that script's state_dict keys.
//   decoder  a causal decoder with rotary embedding, SwiGLU FFN, no biases and a
//            final RMSNorm (what llama.cpp and Hugging Face call llama, and users
//            call it: --arch llama, "arch": "llama"). Its options cover the
//            pretrained checkpoints of the families of that form (src/models/):
//            grouped-query attention (kv_heads), a head dim stated on its own
//            (head_dim), the head tied to the embedding (tie_embeddings: one
//            parameter, "embed.weight", no "head.weight"), q/k/v biases (qkv_bias),
//            an RMSNorm over each head of q and k before the rotary embedding
//            (qk_norm), scaled rotary frequencies (rope_scaling), (1 + w) and
//            sandwich norms, GeGLU, a scaled embedding and sliding windows.
//
// Presets: "seed" (the reference size) and "tiny" (sized for a 2-core CPU).
// Every field can be overridden after picking a preset; validate() refuses
// impossible combinations with a message that names the values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/nn/layers.h"
#include "fsdp/nn/loss.h"
#include "fsdp/nn/moe.h"

namespace fsdp::nn {

enum class Arch : uint8_t { seed, decoder };
// The forms' names as users write them (--arch, the config JSON's "arch"): each is named after the
// family that is it (seed, llama), so the names are defined with the families
// (src/models/forms.cpp), not here. parse_arch refuses another name, listing these.
Arch parse_arch(const std::string& s);
std::string arch_name(Arch a);

struct TransformerConfig {
  Arch arch = Arch::seed;
  int64_t vocab = 32000, dim = 2048, layers = 12, heads = 16;
  int64_t seq = 1024, batch = 8;
  int64_t ffn_hidden = 0;          // 0: 4*dim for seed, 8/3*dim rounded up to 256 for decoder
  double rope_theta = 10000.0;     // decoder only
  std::optional<double> norm_eps;  // unset: the compute dtype's epsilon, as nn.RMSNorm(eps=None)
  // decoder only:
  int64_t kv_heads = 0;           // 0 or heads: multi-head; 1: multi-query; dividing heads: GQA
  int64_t head_dim = 0;           // 0: dim / heads; else q is heads*head_dim, k/v kv_heads*head_dim
  bool tie_embeddings = false;    // the head computes with the embedding's weight (one parameter,
                                  // initialised N(0, 1/dim) so that the first logits are ~N(0, 1))
  bool qkv_bias = false;          // biases on q, k and v (Qwen2), in the packed in_proj_bias
  bool qk_norm = false;           // RMSNorm over each head's dims of q and k (Qwen3)
  ops::RopeScaling rope_scaling;  // Llama 3's scaled rotary frequencies (factor 0: none)
  // Gemma 3's options (decoder only):
  bool norm_plus_one = false;   // every RMSNorm is (1 + w), its weight initialised to 0
  bool sandwich_norms = false;  // norms on the attention's and the FFN's outputs too
  bool geglu = false;           // the FFN's gate is gelu's tanh form, not silu
  bool embed_scale = false;     // the embedding's output times sqrt(dim) (in the weights' dtype)
  int64_t sliding_window = 0;   // > 0: the local layers attend to this many keys
  int64_t global_every = 0;     // with a window: layers global_every-1, 2*global_every-1, ... are
                                // global (full attention, rope_theta and rope_scaling); 0: none
  double rope_local_theta = 0;  // the local layers' rope base (0: rope_theta); never scaled
  // LoRA adapters on the projections lora.targets names, in every block; with them every other
  // parameter is frozen (requires_grad false): only the adapters train.
  LoraConfig lora;
  // A mixture of experts in the blocks moe.sparse(i) names (decoder only; Qwen3-MoE, Mixtral): their
  // FFN is an nn::MoE, and the fused loss adds the router's loss (MoEConfig::aux_coef, z_coef).
  MoEConfig moe;
  // The family that owns the config (the config JSON's "family" key; "": a config written before
  // families named themselves, whose family models::spec_of finds by its options) and that
  // family's own options: a JSON object's text, saved under the family's name ("olmo2": {...})
  // and read by its folder (src/models/<family>/); "" for none (the family's defaults).
  std::string family;
  std::string family_options;
  // Layer i's attention: its window (0: full) and its rotary frequencies.
  int64_t layer_window(int64_t i) const;
  bool layer_global(int64_t i) const;

  static TransformerConfig preset(const std::string& name);  // "seed" or "tiny"
  // The model's shape as a JSON object (arch, vocab, dim, layers, heads, ffn_hidden resolved,
  // seq, rope_theta, norm_eps when set, and kv_heads, head_dim, tie_embeddings, qkv_bias, qk_norm,
  // rope_scaling when they differ from the default, so older configs read and compare unchanged):
  // checkpoints and exports carry it, and from_json rebuilds the config, validated (absent keys are
  // defaults; "family" and the family's options object when set). A missing or mistyped key is an
  // error that names it.
  std::string to_json() const;
  static TransformerConfig from_json(const std::string& json);
  int64_t resolved_ffn_hidden() const;
  int64_t resolved_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : dim / heads; }
  void validate() const;
  // Parameters that take part in a token's matmuls (all but the embedding; a tied head counts,
  // since it still does its matmul; of an MoE block the router and top_k experts), for MFU.
  int64_t matmul_params() const;
  // Every parameter but the experts a token does not reach (num_parameters() without MoE).
  int64_t active_parameters() const;
  // Every parameter's element count, from the shape alone (nn_test holds it to a built model's
  // num_parameters()): the size checked against memory and against a file's tensors before any
  // module exists. Saturates at INT64_MAX rather than overflowing. (nn::TransformerBlock's: a
  // family with blocks of its own counts its own, models::num_parameters.)
  int64_t num_parameters() const;
  // Training FLOPs per token: 6 * matmul_params (active) + 12 * heads * head_dim * seq per layer, a
  // windowed layer counting min(window, seq) keys in place of seq (its kernels skip the rest).
  // With LoRA the frozen weights count 4 (no weight gradient), the adapters 6.
  double flops_per_token() const;
  // The adapters' element count (0 without LoRA), within num_parameters().
  int64_t lora_parameters() const;
};

// Whether `name` may name a family in a config: a-z, 0-9 and _, 1 to 64 characters.
bool is_family_name(const std::string& name);

// Whether a parameter name is a LoRA adapter's ("layers.0.attn.lora_A", "...ffn.w2.lora_B").
bool is_lora_parameter(const std::string& name);

// A model family's block for layer `layer` of a config, composed from this header's layers with
// its own forward and backward (src/models/<family>/); the Transformer registers it as
// "layers.<layer>". Its attention modules (MultiheadAttention, anywhere in it) take the KV cache,
// and its MoE modules the router loss.
using BlockFactory =
    std::function<std::unique_ptr<Module>(const TransformerConfig& config, int64_t layer)>;
// The block the config's options describe: nn::TransformerBlock of the seed's form or of llama's
// (a relative of llama's sets its options: biases, QK-norm, Gemma 3's norms, GeGLU, its window
// and rope base on layer `layer`, an MoE where moe.sparse(layer)).
std::unique_ptr<Module> default_block(const TransformerConfig& config, int64_t layer);
// The blocks of the config's family: its own where it has them (OLMo-2's), else default_block
// (llama's relatives, and a config that names no family). The families live in src/models, whose
// registry defines this, as src/models/forms.cpp defines parse_arch; a family name that is no
// family is refused there, by name.
BlockFactory family_blocks(const TransformerConfig& config);

// The generic decoder: embedding, the family's blocks, [final norm], head, the fused loss, the KV
// cache.
class Transformer : public Module {
 public:
  // With the family's block factory (models::spec_of(cfg).build(cfg) passes it).
  Transformer(const TransformerConfig& cfg, const BlockFactory& blocks);
  // With the blocks of the config's family (family_blocks): the model its family builds.
  explicit Transformer(const TransformerConfig& cfg);
  // tokens [B, T] (i32/i64) -> logits [B, T, vocab]; with the batch context's targets, the loss
  // instead (fuses_loss: nn::ChunkedLMLoss over the head, never the whole logits).
  Tensor forward_impl(const Tensor& tokens) override;
  // dlogits [B, T, vocab] (none after a fused loss: d(loss) is the context's loss_scale) ->
  // undefined (the input is discrete). A tied head adds its weight gradient into the
  // embedding's, which the embedding's scatter-add then adds to.
  Tensor backward_impl(const Tensor& dlogits) override;
  bool fuses_loss() const override { return true; }
  const TransformerConfig& config() const { return cfg_; }
  ModuleList& layers() { return *layers_; }
  // Generation with a KV cache of `capacity` positions in every block (the decoder form): after
  // start_kv_cache, each forward takes the next ids of one sequence [1, n] and returns their
  // logits, computing only the new positions. kv_length() is -1 when off.
  void start_kv_cache(int64_t capacity);
  void stop_kv_cache();
  int64_t kv_length();
  // The MoE blocks' FFNs, in layer order (none without cfg.moe).
  const std::vector<MoE*>& moe_layers() const { return moe_; }
  // The router loss over the global batch: `reduce` sums a vector of numbers over the ranks (an
  // all-reduce; RouterTotals' 2E + 2), and the gradient is then `world` times this rank's part,
  // since the data-parallel backward averages the ranks' gradients. Unset: each rank's own rows.
  void set_router_reduce(std::function<void(std::vector<double>&)> reduce, int64_t world);
  // The latest fused forward's router loss term (0 without MoE), within the loss it returned.
  double router_loss() const { return router_loss_; }

 private:
  // The router loss of the forward just run, appended to the fused loss's chunks; sets each MoE
  // layer's gradient for its backward.
  Tensor with_router_loss(const Tensor& loss);
  double embed_scale(DType dtype) const;
  TransformerConfig cfg_;
  Embedding* embed_;
  ModuleList* layers_;
  RMSNorm* norm_ = nullptr;
  Linear* head_ = nullptr;  // null when tied: the logits use embed_'s weight
  std::vector<MoE*> moe_;
  std::vector<MultiheadAttention*> attention_;  // every block's, in layer order (the KV cache)
  std::function<void(std::vector<double>&)> reduce_;
  int64_t world_ = 1;
  double router_loss_ = 0;
  // A call's record: the fused head and loss (its pending forward), or the tied head's input.
  struct Saved {
    ChunkedLMLoss loss;
    Tensor head_x;
  };
};

}  // namespace fsdp::nn
