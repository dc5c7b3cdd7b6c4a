// One training step's allocations, replayed in the order the code makes them, through the
// allocator's model (allocator_replay.h): the memory plan's engine (fsdp/train/memory_plan.h).
// Each member mirrors one piece of the code and names it; when that code changes what it
// allocates or how long it holds it, the member here changes with it (tests/memory_plan_test.sh
// holds the two together). The members live in two files along the code they mirror:
// step_replay_fsdp.cpp (the layout and fully_shard's buffers and hooks, src/fsdp/) and
// step_replay_model.cpp (the ops and the model's forward and backward, src/ops/ and src/nn/).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/train/memory_plan.h"
#include "src/train/allocator_replay.h"

namespace fsdp::train::replay {

using H = AllocatorReplay::H;

// One fully_shard group's buffers (src/fsdp/fsdp_param_group.h): G padded shard elements,
// U unsharded elements.
struct Group {
  std::string label;
  int64_t G = 0, U = 0;
  int64_t master = 4;   // bytes of its sharded dtype
  bool direct = false;  // its parameters are its shards (one rank, no dtype change): no gather
  bool packed = false;  // G counts bytes (master 1), gathered as they are and decoded
  enum { sharded, issued, unsharded } state = sharded;
  H ag_in = -1, ag_out = -1, params = -1, grads = -1;
  bool grads_kept = false;
};

// A block's saved activations (nn/layers.cpp: what each module's forward_impl keeps).
struct Saved {
  H x = -1;  // the block's input: its norm1 keeps it (and the checkpoint, when recomputed)
  H y1 = -1, rstd1 = -1, qkv = -1, attn = -1, lse = -1, h = -1, rstd2 = -1, y2 = -1;
  H f1 = -1, f2 = -1, f3 = -1;  // seed: up's output and silu's; llama: gate, up, swiglu
  H qn = -1, qr = -1, kn = -1, kr = -1;  // qk_norm: q's and k's gathered heads and their rstd
  H pa = -1, rpa = -1, pf = -1, rpf = -1;  // sandwich norms: the attention's and the FFN's
                                           // outputs (their norms' inputs) and their rstd
};

class StepReplay {
 public:
  explicit StepReplay(const MemoryPlanOptions& o);
  // Two steps of `grad_accum` microbatches; the plan at the peak, by term.
  MemoryPlan run();

 private:
  struct Pending {  // a reduce-scatter in flight: its input and output buffers, G elements a rank
    H in, out;
    int64_t G;
  };

  // An op (src/ops/cpu_ops.cpp) holds widened copies of its inputs (CPU, storage dtype narrower
  // than compute) until it returns; its outputs are made in the compute dtype and narrowed back.
  struct Op {
    StepReplay& s;
    std::vector<H> tmp;
    explicit Op(StepReplay& st) : s(st) {}
    Op(const Op&) = delete;
    Op& operator=(const Op&) = delete;
    void in(int64_t elems) {  // as_compute of an input in the activation dtype
      if (s.narrow_) tmp.push_back(s.r_.alloc(elems * s.comp_, kWork));
    }
    void grad(int64_t elems) {  // Accum of a gradient buffer not in the compute dtype
      if (s.cpu_ && s.grad_ != s.comp_) tmp.push_back(s.r_.alloc(elems * s.comp_, kWork));
    }
    H out(int64_t elems, Term t) {  // in the compute dtype, kept in the storage dtype
      const H h = s.r_.alloc(elems * s.comp_, t);
      if (!s.narrow_) return h;
      tmp.push_back(h);  // freed when the op returns, after the narrowed copy is made
      return s.r_.alloc(elems * s.act_, t);
    }
    H stat(int64_t elems, Term t) { return s.r_.alloc(elems * s.stat_, t); }
    ~Op() {
      for (auto it = tmp.rbegin(); it != tmp.rend(); ++it) s.r_.free(*it);
    }
  };

  // ---- step_replay_fsdp.cpp: the layout, the data, fully_shard's buffers and hooks
  void layout();
  Group& root() { return groups_.back(); }
  H alloc_batch();
  void free_batch(H in);
  void issue(Group& g);
  void wait(Group& g);
  void reshard(Group& g);
  void prepare_grads(Group& g);
  void reduce_grads(Group& g);
  void complete_oldest();
  void add_into_sharded(const Pending& p);
  void finish_backward();
  void issue_all(int64_t i);
  void pre_forward(int64_t i);
  void post_forward(int64_t i);
  void pre_backward(int64_t i);
  void post_backward(int64_t i);

  // ---- step_replay_model.cpp: the ops, a block's forward and backward, one microbatch
  H linear(int64_t in, int64_t out, Term t = kActivations);
  H linear_backward(int64_t in, int64_t out, Term t = kWork);
  std::pair<H, H> rmsnorm();
  void chunk_logits(int64_t rows, bool backward);
  H rmsnorm_backward();
  H elementwise(int64_t inputs, int64_t elems, Term t);
  void add_inplace(int64_t elems);
  void rope(int64_t width);
  void qk_norm(Saved& s);
  void qk_norm_backward(Saved& s);
  int64_t attention_scratch(bool backward) const;
  H block_forward(H x, Saved& s, const std::string& where);
  void release(Saved& s);
  H block_backward(Saved& s, const std::string& where);
  bool checkpointed(int64_t i) const;
  void microbatch();

  const MemoryPlanOptions& o_;
  const nn::TransformerConfig& c_;
  bool cpu_;
  AllocatorReplay r_;
  int64_t R_, d_, F_, hd_, nh_, kv_, V_, L_, q_ = 0, w_ = 0;
  int64_t master_ = 4, act_ = 4, red_ = 4, comp_ = 4, stat_ = 4, grad_ = 4;
  bool narrow_ = false, gathered_ = false, sync_ = true;
  int64_t frozen_master_ = 4;
  bool frozen_direct_ = false;
  std::vector<Group> groups_;  // blocks 0..L-1, then the root
  // Their frozen parameters' groups (LoRA's base; empty without LoRA), gathered beside them and
  // never given gradients (FSDPState's second group).
  std::vector<Group> frozen_, packed_;  // per block and the root, as groups_
  int64_t flat_ = 0, persistent_ = 0;
  std::vector<Pending> rs_, replica_;
  std::map<H, H> batches_;
};

}  // namespace fsdp::train::replay
