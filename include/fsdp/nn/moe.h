// nn::MoE: a mixture-of-experts feed-forward layer (Qwen3-MoE's sparse block, Mixtral's
// block_sparse_moe), dropless, with the load-balancing auxiliary loss as transformers computes it.
//
// Parameters (stacked per expert, so fully_shard shards them as any other parameter and an expert
// parallel split is rows of dim 0):
//   gate.weight                [E, dim]     the router (a Linear, no bias)
//   experts.gate_proj          [E, H, dim]  SwiGLU: down(silu(gate x) * up x), per expert
//   experts.up_proj            [E, H, dim]
//   experts.down_proj          [E, dim, H]
//
// One forward, over the rows x [N, dim] (any leading dims):
//   route     logits = x gate^T; Qwen3-MoE: p = softmax(logits), the top k of p, optionally
//             renormalized over the k (norm_topk_prob); Mixtral: the top k of the logits, softmax
//             over the k. Ties go to the lower expert index. Computed in f64 on the host.
//   permute   the N k (token, choice) pairs stably sorted by expert, so each expert's rows are
//             contiguous (offsets[e] .. offsets[e + 1]); xp [N k, dim] holds their inputs
//   exchange  expert parallel only (set_expert_parallel): each expert's rows sent to the rank of
//             the ep group that holds it (an ExpertExchange: dist::ExpertDispatch), which
//             gets its local experts' rows from every rank of the group, grouped by expert
//   experts   one GEMM per expert per projection over its rows (views of xp and of the stacked
//             weights: no copies), the SwiGLU over all rows at once
//   exchange back  the experts' outputs returned to the ranks the rows came from, in xp's order
//   combine   out[t] = sum_j w[t, j] y[t, j], for each token its k choices in order, in f64: the
//             result of a token depends on nothing but its own rows, so not on the world size.
// Every token reaches its k experts (no capacity factor); an expert may get no rows.
//
// Expert parallel: with an ep group of n ranks, rank j holds experts [j E/n, (j + 1) E/n) only
// (the stacked weights' rows of dim 0: experts.* is [E/n, ...]); the router stays whole and
// replicated, and every rank routes its own tokens over all E experts. An expert receives the
// group's rows in rank order (the order one rank over the group's tokens concatenated would give),
// and each token's combine reads its own k rows in a fixed order, so the results do not depend on
// n. The backward runs the exchanges' backwards (each the other's inverse permutation). Every rank
// of the group calls each forward and backward together (collectives).
//
// The auxiliary loss (transformers' load_balancing_loss_func) is over every MoE layer's router
// probabilities at once, not a sum of per-layer losses: with T the rows of all layers together,
// C_e the (token, choice) pairs routed to e and P_e the sum of e's probabilities over those rows,
//   aux = E * sum_e C_e P_e / T^2,
// added to the loss times router_aux_loss_coef; the router z-loss (ST-MoE), optional, is
// z_coef * sum_rows logsumexp(logits)^2 / T. So each call records its statistics (RouterCall:
// C, P, T and the z sum), the model sums them over its layers (and, for the global batch's
// statistics, over the ranks: 2E + 2 numbers) after the forward, router_aux_loss() gives the term
// and its gradient (d aux / d p[t, e] = E C_e / T^2 for every row: the one-hot choice has none),
// and each layer is handed that gradient (set_router_grad), which its backward adds.
//
// Device: the routing (the top k, the weights and the stable sort) and the router's backward are
// host loops in f64 over the logits read back (a sync on CUDA), E values a token; the permutation
// (ops::copy_segments), the experts' GEMMs and the combine and its backward (ops::moe_combine) run
// where the tensors live: the CPU, CUDA (compiled, never run on a GPU yet) and the meta device (the
// memory plan), which allocates what the CPU does and computes nothing (every token goes to
// experts 0..k-1). Kept for the backward: the router's logits as a tensor in the activations'
// dtype (the probabilities are recomputed from them), and the N k choices, weights and rows.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/module.h"

namespace fsdp::nn {

// Expert parallel's exchange as the layer sees it, so that nn names no process group (the
// distributed layer sits above it): dist::ExpertDispatch is one. Made for each forward from this
// rank's rows per global expert; a permutation of rows, so each one's backward is the other.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  // rows [sum(counts), ...] in global expert order -> this rank's experts' rows from every rank,
  // grouped by local expert (local_counts() rows each).
  virtual Tensor dispatch(const Tensor& rows) const = 0;
  // The inverse: the experts' outputs in dispatch's order -> rows in the order given to dispatch.
  virtual Tensor combine(const Tensor& expert_rows) const = 0;
  virtual const std::vector<int64_t>& local_counts() const = 0;
};

// An MoE's expert parallel: its rank in a group of `size` (rank r holds the global experts
// [r E / size, (r + 1) E / size)), and how to make the exchange from this rank's rows per global
// expert (dist::expert_parallel(group, experts) makes one over a process group).
struct ExpertParallel {
  int size = 1, rank = 0;
  std::function<std::shared_ptr<const ExpertExchange>(std::vector<int64_t> counts)> exchange;
};

enum class RouterKind : uint8_t {
  softmax_topk,  // Qwen3-MoE: softmax over the experts, top k, renormalized when norm_topk_prob
  topk_softmax,  // Mixtral: top k of the logits, softmax over the k
};

struct MoEOptions {
  int64_t experts = 0;  // E
  int64_t top_k = 0;    // k, in [1, E]
  int64_t hidden = 0;   // H: each expert's intermediate size (moe_intermediate_size)
  RouterKind router = RouterKind::softmax_topk;
  bool norm_topk_prob = false;  // softmax_topk only: the k weights divided by their sum
};

// A model's mixture of experts (nn::TransformerConfig::moe): which blocks' FFN is an MoE and its
// options. Block i is sparse when experts > 0, i is not in dense_layers and (i + 1) is a multiple
// of sparse_step (transformers' Qwen3-MoE: mlp_only_layers, decoder_sparse_step); a dense block
// keeps the config's FFN (ffn_hidden).
struct MoEConfig {
  int64_t experts = 0;  // 0: no MoE
  int64_t top_k = 0, hidden = 0;
  RouterKind router = RouterKind::softmax_topk;
  bool norm_topk_prob = false;
  int64_t sparse_step = 1;
  std::vector<int64_t> dense_layers;
  double aux_coef = 0;  // router_aux_loss_coef: the load-balancing loss's weight in the loss
  double z_coef = 0;    // the router z-loss's (0: none)
  bool enabled() const { return experts > 0; }
  bool sparse(int64_t layer) const;
  int64_t sparse_layers(int64_t layers) const;
  MoEOptions options() const {
    return {.experts = experts, .top_k = top_k, .hidden = hidden, .router = router,
            .norm_topk_prob = norm_topk_prob};
  }
  // Refuses, naming the field, what no model holds (top_k over experts, a dense layer index
  // outside [0, layers)).
  void validate(int64_t layers) const;
  bool operator==(const MoEConfig&) const = default;
};
const char* router_kind_name(RouterKind kind);  // "softmax_topk", "topk_softmax"

// One call's routing statistics (MoE::last_call()).
struct RouterCall {
  int64_t rows = 0;              // this call's rows (tokens)
  std::vector<double> pairs;     // [E] C_e: (token, choice) pairs routed to e
  std::vector<double> prob_sum;  // [E] P_e: the sum over rows of softmax(logits)[e]
  double z_sum = 0;              // the sum over rows of logsumexp(logits)^2
};

// The statistics of several calls (a model's MoE layers; after an all-reduce, every rank's), as
// one vector of 2E + 2 numbers: C, P, T, z sum.
struct RouterTotals {
  std::vector<double> pairs, prob_sum;
  double rows = 0, z_sum = 0;
  void add(const RouterCall& call);
  std::vector<double> as_vector() const;
  static RouterTotals from_vector(const std::vector<double>& v);  // [2E + 2]
};

struct RouterLossOptions {
  int64_t experts = 0;
  double aux_coef = 0;  // router_aux_loss_coef
  double z_coef = 0;    // 0: no z-loss
  // d(total loss) / d(this term) on this rank: the backward's loss scale, times the world size when
  // the totals are the global batch's and the gradients are then averaged over the ranks.
  double grad_scale = 1;
};

// What the router's backward adds: d loss / d p[t, e] = dprob[e] for every row t of every call
// (the aux loss: the choices' one-hot has no gradient, so it is the same for every row), and
// d loss / d logsumexp(logits[t])^2 = dz. The same for every call that the totals cover.
struct RouterGrad {
  std::vector<double> dprob;
  double dz = 0;
};
struct RouterLoss {
  double value = 0;  // aux_coef * aux + z_coef * z
  RouterGrad grad;   // times grad_scale
};
RouterLoss router_aux_loss(const RouterTotals& totals, const RouterLossOptions& opt);

// The experts' stacked weights and their grouped GEMMs. Called by MoE only (its forward takes the
// permuted rows and the experts' row offsets, which a Module's forward cannot carry).
class Experts : public Module {
 public:
  Experts(int64_t dim, int64_t experts, int64_t hidden);
  // xp [R, dim] permuted rows, expert e's rows offsets[e] .. offsets[e + 1] -> [R, dim]
  Tensor grouped_forward(const Tensor& xp, const std::vector<int64_t>& offsets);
  Tensor grouped_backward(const Tensor& dyp);
  int64_t experts() const { return experts_; }
  // Holds `local` experts' rows of the stack ([local, ...]) in place of all of them. Before the
  // parameters materialize only.
  void set_local_experts(int64_t local);

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  struct Saved {
    Tensor xp, g, u;
    std::vector<int64_t> offsets;
  };
  int64_t experts_;
  Parameter* gate_proj_;
  Parameter* up_proj_;
  Parameter* down_proj_;
};

class MoE : public Module {
 public:
  MoE(int64_t dim, MoEOptions opt);
  Tensor forward_impl(const Tensor& x) override;  // x [..., dim]
  Tensor backward_impl(const Tensor& dy) override;
  const MoEOptions& options() const { return opt_; }
  // Expert parallel (size 1: none): this rank holds its share of the experts (experts.*
  // [E / size, ...], rank r's rows from r E / size) and exchanges the permuted rows through
  // ep.exchange. Before the parameters materialize; refuses an E that the size does not divide.
  void set_expert_parallel(ExpertParallel ep);
  int expert_parallel_size() const { return ep_.size; }
  // The first global expert this rank holds (0 without expert parallel) and how many.
  int64_t first_local_expert() const;
  int64_t local_experts() const { return experts_->experts(); }
  // The latest forward's statistics (null before one).
  const std::shared_ptr<RouterCall>& last_call() const { return last_; }
  // The router loss's gradient for the backwards of the batch context's microbatch (each call's
  // recompute under activation checkpointing included), until set again. Unset: none.
  void set_router_grad(RouterGrad grad);

 private:
  // Where each (token, choice) pair went: expert, weight and row of the permuted layout.
  struct Routing {
    std::vector<int32_t> expert;    // [N k]
    std::vector<double> weight;     // [N k]
    std::vector<int64_t> pos;       // [N k] row in xp
    std::vector<int64_t> offsets;   // [E + 1]
    Tensor logits;                  // [N, E] the router's, in the activations' dtype
  };
  Routing route(const Tensor& logits, RouterCall& call) const;
  // d loss / d logits [N E] from the weights' gradient dw [N k] and the router loss's.
  std::vector<double> router_backward(const Routing& r, const std::vector<double>& dw) const;
  // The experts over the permuted rows, through the ep group's exchange where there is one
  // (`dispatch` is set to it, for the backward).
  Tensor run_experts(Tensor xp, const std::vector<int64_t>& offsets,
                     std::shared_ptr<const ExpertExchange>& dispatch);
  struct Saved {
    Routing routing;
    Tensor pos, weight;  // routing.pos (i64) and .weight (f64) on the input's device
    Tensor yp;  // the experts' outputs, permuted (the weights' gradient)
    Shape shape;
    std::shared_ptr<const ExpertExchange> dispatch;  // expert parallel's exchange
  };
  int64_t dim_;
  MoEOptions opt_;
  Linear* gate_;
  Experts* experts_;
  ExpertParallel ep_;
  std::shared_ptr<RouterCall> last_;
  std::map<int64_t, RouterGrad> grads_;  // by microbatch
};

}  // namespace fsdp::nn
