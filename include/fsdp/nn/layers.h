// The building blocks of the Transformer, each with PyTorch's parameter names and
// default initialisation, so that state_dicts line up name for name (each keeps what its backward
// needs in a record of the call, its private Saved: Module's save_for_backward, so any of them
// may run several times in one forward):
//   Linear            weight [out, in], bias [out]     U(-1/sqrt(in), 1/sqrt(in))
//   Embedding         weight [vocab, dim]              N(0, 1)
//   RMSNorm           weight [dim]                     ones; eps defaults to the dtype's epsilon
//   MultiheadAttention in_proj_weight [3d, d], in_proj_bias [3d], out_proj.{weight,bias}
//                     (nn.MultiheadAttention: xavier_uniform in-projection, zero biases).
//                     With kv_heads and head_dim (llama's grouped-query attention), the packed
//                     in_proj_weight is [(heads + 2 kv_heads) hd, d]: the rows of q_proj, then
//                     k_proj, then v_proj; in_proj_bias likewise; out_proj is [d, heads hd].
//                     With qk_norm: q_norm.weight and k_norm.weight [hd] (RMSNorm, ones); over
//                     the whole width (qk_norm_whole, OLMo-2's): [heads hd] and [kv_heads hd].
//   FeedForward       seed: "0" Linear(d, 4d), SiLU, "2" Linear(4d, d), no bias
//                     llama: w1 (gate), w3 (up), w2 (down), SwiGLU, no bias
//   LoRA adapters     lora_A [parts * rank, in]   U(-1/sqrt(in), 1/sqrt(in)) (PEFT's
//                                                 kaiming_uniform(a = sqrt(5)))
//                     lora_B [adapted rows, rank] zeros (a fresh adapter changes nothing)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/nn/module.h"
#include "fsdp/ops/ops.h"
#include "fsdp/ops/rope.h"

namespace fsdp::nn {

// LoRA (Hu et al. 2021, as PEFT's LoraLayer computes it): a projection y = W x + b gains
// (alpha / rank) B A x, with A [rank, in] and B [out, rank] the only parameters trained. The
// projections a model adapts are named by `targets` (LoraTarget bits); a module given a config
// adapts what its targets name.
enum LoraTarget : uint32_t { q = 1, k = 2, v = 4, o = 8, gate = 16, up = 32, down = 64 };
struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 0;  // the adapter's output is scaled by alpha / rank
  uint32_t targets = 0;
  bool on(LoraTarget t) const { return rank > 0 && (targets & t) != 0; }
  bool enabled() const { return rank > 0 && targets != 0; }
  double scale() const { return alpha / double(rank); }
  bool operator==(const LoraConfig&) const = default;
};
// "q,k,v,o,gate,up,down" <-> bits; an unknown name is refused by name.
uint32_t parse_lora_targets(const std::string& list);
std::string lora_target_names(uint32_t targets);

// While one lives, every LoRA adapter forward on this thread adds nothing: the model computes as
// its frozen base alone, with no second copy of the weights (a preference loss's reference
// forward, train/preference.h; PEFT's disable_adapter()). Such a forward keeps nothing for a
// backward of the adapters. Scopes nest.
class LoraDisabledScope {
 public:
  LoraDisabledScope();
  ~LoraDisabledScope();
  LoraDisabledScope(const LoraDisabledScope&) = delete;
  LoraDisabledScope& operator=(const LoraDisabledScope&) = delete;
};
bool lora_disabled();  // a LoraDisabledScope lives on this thread

// One adapter pair on a projection of `out` rows: `parts` are the row ranges [begin, end) it
// adapts, each with its own rank-r pair (the packed in-projection's q, k and v); A's rows and B's
// rows are the parts' in order. forward adds into the projection's output and returns what the
// backward needs (scale x A^T), which the owning module keeps in its call's record; backward
// adds into A's and B's gradients and into dx. The adapter itself keeps nothing per call.
class LoraAdapter {
 public:
  LoraAdapter(Parameter& a, Parameter& b, int64_t out,
              std::vector<std::pair<int64_t, int64_t>> parts, double scale);
  Tensor forward(const Tensor& x, const Tensor& y);
  // xa: what forward returned, handed over (freed before dx's GEMM).
  void backward(const Tensor& dy, const Tensor& x, Tensor xa, const Tensor& dx);

 private:
  // B laid out over the projection's rows: [out, parts * rank], zero off its parts' blocks.
  Tensor full_b(const Tensor& b) const;
  Parameter* a_;
  Parameter* b_;
  int64_t out_, rank_;
  double scale_;
  bool whole_;                        // one part covering every row: B is its own full form
  std::vector<ops::Segment> b_rows_;  // B's rows -> full_b's
};

class Linear : public Module {
 public:
  // lora.rank > 0: the projection is adapted (lora_A, lora_B), whatever lora.targets says.
  Linear(int64_t in, int64_t out, bool bias, LoraConfig lora = {});
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_; }

 private:
  struct Saved {
    Tensor x, xa;  // xa: the adapter's
  };
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  std::optional<LoraAdapter> lora_;
};

// forward() takes token ids [B, T] (i32/i64) and returns [B, T, dim];
// backward() adds into the weight gradient and returns an undefined tensor.
class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim);
  Tensor forward_impl(const Tensor& ids) override;
  Tensor backward_impl(const Tensor& dy) override;
  Parameter& weight() { return *weight_; }

 private:
  struct Saved {
    Tensor ids;
  };
  Parameter* weight_;
};

// plus_one: Gemma's RMSNorm, y = norm(x) * (1 + w) with w initialised to 0.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, std::optional<double> eps = std::nullopt, bool plus_one = false);
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  struct Saved {
    Tensor x, rstd;
  };
  Parameter* weight_;
  std::optional<double> eps_;
  double offset_;
};

struct AttentionOptions {
  bool bias = true;            // in_proj_bias and out_proj.bias
  bool causal = false;         // mask out future positions
  double rope_theta = 0.0;     // > 0: rotary embedding on q and k (half-split pairs)
  ops::RopeScaling rope_scaling;  // Llama 3's scaled frequencies (with rope_theta > 0)
  bool xavier_in_proj = true;  // nn.MultiheadAttention's init; false: Linear's init
  int64_t kv_heads = 0;        // 0: heads (multi-head); fewer, dividing heads: grouped-query
  int64_t head_dim = 0;        // 0: dim / heads
  bool qkv_bias = false;       // in_proj_bias without out_proj.bias (Qwen2)
  int64_t window = 0;          // > 0: a sliding window of this many keys (causal; 0: none)
  // QK-norm (Qwen3, Gemma 3): an RMSNorm over each head's dims of q and of k, before the rotary
  // embedding; weights "q_norm.weight" and "k_norm.weight" [head_dim], with this epsilon.
  bool qk_norm = false;
  // With qk_norm: one RMSNorm over all of q's heads and one over all of k's (each token's whole
  // projection, OLMo-2's), weights [heads * head_dim] and [kv_heads * head_dim], not per head.
  bool qk_norm_whole = false;
  std::optional<double> norm_eps;
  bool norm_plus_one = false;  // the q/k norms are Gemma's (1 + w)
  // Adapters on q, k and v (one packed pair over the in-projection's rows: lora_A, lora_B) and
  // on out_proj, as lora.targets names them.
  LoraConfig lora;
};

// Packed rows (the batch context's doc_start; causal only): each document attends within itself
// and its rotary positions start at 0.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t dim, int64_t heads, AttentionOptions opt);
  Tensor forward_impl(const Tensor& x) override;  // x [B, T, dim]
  Tensor backward_impl(const Tensor& dy) override;

  // Generation: between start_kv_cache and stop_kv_cache, forward takes the next positions of
  // one sequence (B = 1, causal attention only), appends their keys and values to a cache of
  // `capacity` positions and attends over everything cached. No backward in between.
  void start_kv_cache(int64_t capacity);
  void stop_kv_cache();
  int64_t kv_length() const { return kv_len_; }  // cached positions; -1 when off
  int64_t heads() const { return heads_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return hd_; }

 private:
  Tensor forward_cached(const Tensor& x);
  // QK-norm in place on the packed qkv [B, T, (heads + 2 kv_heads) hd]: q and k gathered (per head,
  // or per token over the whole width), normalized by q_norm_ and k_norm_ (each pushing its call's
  // record), scattered back.
  void qk_norm_forward(const Tensor& qkv);
  void qk_norm_backward(const Tensor& dqkv);
  int64_t dim_, heads_, kv_heads_, hd_;
  AttentionOptions opt_;
  Tensor k_cache_, v_cache_;
  int64_t kv_len_ = -1, kv_cap_ = 0;
  Parameter* in_proj_weight_;
  Parameter* in_proj_bias_ = nullptr;
  Linear* out_proj_;
  RMSNorm* q_norm_ = nullptr;  // qk_norm only
  RMSNorm* k_norm_ = nullptr;
  std::optional<LoraAdapter> lora_;  // on the in-projection's q, k, v rows
  struct Saved {
    Tensor x, xa, qkv, out, lse, doc_start;  // xa: the adapter's
  };
};

class FeedForward : public Module {
 public:
  enum class Kind : uint8_t { silu_mlp, swiglu, geglu };  // geglu: Gemma's, gelu's tanh form
  // lora: adapters on the gate, up and down projections its targets name.
  FeedForward(int64_t dim, int64_t hidden, Kind kind, LoraConfig lora = {});
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  struct Saved {
    Tensor h, g, u;  // silu_mlp: h; gated: g, u
  };
  Kind kind_;
  Linear* up_;              // "0" or "w3"
  Linear* down_;            // "2" or "w2"
  Linear* gate_ = nullptr;  // "w1" (swiglu and geglu)
};

// x + attn(norm1(x)), then x + ffn(norm2(x)): the pre-norm block of the reference script. With
// sandwich norms (Gemma): x + post_attn_norm(attn(norm1(x))), then
// x + post_ffn_norm(ffn(norm2(x))); with norm_plus_one every norm is (1 + w).
struct NormOptions {
  std::optional<double> eps;
  bool plus_one = false;
  bool sandwich = false;
};
class TransformerBlock : public Module {
 public:
  // attn.lora adapts the FFN too. ffn: the block's feed-forward in place of a FeedForward (an MoE),
  // registered as "ffn".
  TransformerBlock(int64_t dim, int64_t heads, int64_t ffn_hidden, FeedForward::Kind ffn_kind,
                   AttentionOptions attn, NormOptions norms, std::unique_ptr<Module> ffn = nullptr);
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  MultiheadAttention& attn() { return *attn_; }

 private:
  RMSNorm* norm1_;
  MultiheadAttention* attn_;
  RMSNorm* post_attn_norm_ = nullptr;  // sandwich only
  RMSNorm* norm2_;
  Module* ffn_;
  RMSNorm* post_ffn_norm_ = nullptr;  // sandwich only
};

}  // namespace fsdp::nn
