// The memory plan (fsdp/train/memory_plan.h): a replay of one training step's allocations through
// a model of the allocator. Each function below mirrors one piece of the code and names it; when
// that code changes what it allocates or how long it holds it, the function here changes with it
// (tests/memory_plan_test.sh holds the two together).
#include "fsdp/train/memory_plan.h"

#include <stddef.h>

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/dist/placement.h"
#include "fsdp/nn/module.h"

namespace fsdp::train {

namespace {

enum Term : uint8_t { kPersistent, kParams, kGrads, kActivations, kLogits, kWork, kData, kTerms };

// The allocator, replayed: live bytes (its `current`), and what the process holds. On CPU a block
// of 64 KiB or more is page-rounded and, once freed, kept for the next request of that size
// while the cache holds less than its limit (core/allocator.cpp); smaller ones come from malloc.
// Kernel scratch (std::vector in kernels/cpu) is resident for one op but never counted as live.
class Replay {
 public:
  using H = int32_t;  // a block; -1 for none
  Replay(bool cpu, int64_t cache_limit) : cpu_(cpu), cache_limit_(cache_limit) {}

  H alloc(int64_t bytes, Term term) {
    if (bytes <= 0) return -1;
    blocks_.push_back({bytes, term, true});
    live_ += bytes;
    term_[term] += bytes;
    if (cpu_) {
      if (bytes >= kCacheMin) {
        int64_t& cached = cached_[page(bytes)];
        if (cached > 0) {
          --cached;
          cached_bytes_ -= page(bytes);
        } else {
          resident_ += page(bytes);
        }
      } else {
        resident_ += (bytes + 63) / 64 * 64;
      }
    }
    note(0);
    return H(blocks_.size() - 1);
  }

  void free(H h) {
    if (h < 0) return;
    Block& b = blocks_[size_t(h)];
    FSDP_CHECK(b.live, "[memory plan] internal: a block is freed twice");
    b.live = false;
    live_ -= b.bytes;
    term_[b.term] -= b.bytes;
    if (!cpu_) return;
    if (b.bytes < kCacheMin) {
      resident_ -= (b.bytes + 63) / 64 * 64;
    } else if (cached_bytes_ + page(b.bytes) <= cache_limit_) {
      ++cached_[page(b.bytes)];
      cached_bytes_ += page(b.bytes);
    } else {
      resident_ -= page(b.bytes);
    }
  }

  // Memory an op holds outside the allocator while it runs (CPU kernels' scratch).
  void scratch(int64_t bytes) {
    if (!cpu_ || bytes <= 0) return;
    note(bytes);
  }

  void at(std::string where) { where_ = std::move(where); }

  int64_t peak() const { return peak_; }
  int64_t peak_live() const { return peak_live_; }
  const std::array<int64_t, kTerms>& terms_at_peak() const { return at_peak_; }
  int64_t cache_at_peak() const { return cache_at_peak_; }
  const std::string& where_at_peak() const { return where_at_peak_; }

 private:
  static constexpr int64_t kCacheMin = 64 << 10;
  static int64_t page(int64_t n) { return (n + 4095) / 4096 * 4096; }

  void note(int64_t scratch) {
    peak_live_ = std::max(peak_live_, live_);
    const int64_t now = (cpu_ ? resident_ : live_) + scratch;
    if (now <= peak_) return;
    peak_ = now;
    at_peak_ = term_;
    at_peak_[kWork] += scratch;
    int64_t terms = 0;
    for (int64_t t : at_peak_) terms += t;
    cache_at_peak_ = now - terms;  // freed blocks held, and rounding
    where_at_peak_ = where_;
  }

  struct Block {
    int64_t bytes;
    Term term;
    bool live;
  };
  bool cpu_;
  int64_t cache_limit_;
  std::vector<Block> blocks_;
  std::map<int64_t, int64_t> cached_;  // page-rounded size -> free blocks of that size
  int64_t live_ = 0, resident_ = 0, cached_bytes_ = 0, peak_ = 0, peak_live_ = 0;
  int64_t cache_at_peak_ = 0;
  std::array<int64_t, kTerms> term_{}, at_peak_{};
  std::string where_, where_at_peak_;
};

using H = Replay::H;

// One fully_shard group's buffers (src/fsdp/fsdp_param_group.h): G padded shard elements,
// U unsharded elements.
struct Group {
  std::string label;
  int64_t G = 0, U = 0;
  enum { sharded, issued, unsharded } state = sharded;
  H ag_in = -1, ag_out = -1, params = -1, grads = -1;
  bool grads_kept = false;
};

// A block's saved activations (nn/layers.cpp: what each module's forward_impl keeps).
struct Saved {
  H x = -1;  // the block's input: its norm1 keeps it (and the checkpoint, when recomputed)
  H y1 = -1, rstd1 = -1, qkv = -1, attn = -1, lse = -1, h = -1, rstd2 = -1, y2 = -1;
  H f1 = -1, f2 = -1, f3 = -1;  // seed: up's output and silu's; llama: gate, up, swiglu
};

class Step {
  struct Pending {  // a reduce-scatter in flight: its input and output buffers, G elements a rank
    H in, out;
    int64_t G;
  };

 public:
  explicit Step(const MemoryPlanOptions& o)
      : o_(o),
        c_(o.model),
        cpu_(o.device.is_cpu()),
        r_(cpu_, o.cpu_cache_bytes),
        R_(c_.batch * c_.seq),
        d_(c_.dim),
        F_(c_.resolved_ffn_hidden()),
        hd_(c_.resolved_head_dim()),
        nh_(c_.heads),
        kv_(c_.resolved_kv_heads()),
        V_(c_.vocab),
        L_(c_.layers) {
    q_ = nh_ * hd_;
    w_ = (nh_ + 2 * kv_) * hd_;
    const DType pd = o.fully_shard ? o.param_dtype.value_or(o.dtype) : o.dtype;
    const DType rd = o.fully_shard ? o.reduce_dtype.value_or(pd) : o.dtype;
    master_ = int64_t(dtype_size(o.dtype));
    act_ = int64_t(dtype_size(pd));
    red_ = int64_t(dtype_size(rd));
    // CPU ops compute in f32 (f64 for f64) and narrow back (src/ops/cpu_ops.cpp); CUDA's compute
    // in the storage dtype with f32 statistics.
    comp_ = cpu_ ? (pd == DType::f64 ? 8 : 4) : act_;
    stat_ = cpu_ ? comp_ : 4;
    narrow_ = comp_ != act_;
    gathered_ = o.fully_shard &&
                !(o.shards == 1 && o.replicas == 1 && pd == o.dtype && rd == o.dtype);
    grad_ = gathered_ ? red_ : master_;
    layout();
  }

  MemoryPlan run() {
    // Persistent: each group's sharded parameters and gradients (fully_shard), or the flat
    // buffers (--shard none), and AdamW's two moments of the same shape.
    r_.at("setup");
    for (int k = 0; k < 4; ++k)
      if (o_.fully_shard)
        for (const Group& g : groups_) r_.alloc(g.G * master_, kPersistent);
      else
        r_.alloc(flat_ * master_, kPersistent);
    int64_t elems = o_.fully_shard ? 0 : flat_;
    if (o_.fully_shard)
      for (const Group& g : groups_) elems += g.G;
    persistent_ = 4 * elems * master_;
    // Two steps: the second starts with the first's staged batch and its blocks cached.
    H staged = -1;
    for (int step = 0; step < 2; ++step)
      for (int64_t micro = 0; micro < o_.grad_accum; ++micro) {
        sync_ = micro == o_.grad_accum - 1;
        const H batch = staged >= 0 ? staged : alloc_batch();
        microbatch();
        staged = alloc_batch();  // DataLoader::prefetch, after the backward
        free_batch(batch);
      }
    MemoryPlan p;
    p.peak_allocated = r_.peak_live();
    p.persistent = persistent_;
    p.at = r_.where_at_peak();
    const auto& t = r_.terms_at_peak();
    auto add = [&](const char* name, const char* what, int64_t bytes) {
      p.terms.push_back({name, what, bytes});
      p.peak += bytes;
    };
    add("persistent", "sharded params, grads, AdamW m and v", t[kPersistent]);
    add("params in flight", "all-gathered and unsharded params", t[kParams]);
    add("grads in flight", "unsharded grads, reduce-scatter buffers", t[kGrads]);
    add("activations", "saved for the backward", t[kActivations]);
    add("logits", "logits (dlogits in place), loss", t[kLogits]);
    add("op working set", "activation grads, op temporaries", t[kWork]);
    add("data", "token batches", t[kData]);
    if (cpu_) {
      add("allocator cache", "freed blocks kept for reuse", r_.cache_at_peak());
      add("process baseline", "runtime, libraries, threads, data", o_.baseline_bytes);
    }
    return p;
  }

 private:
  // ---------------------------------------------------------------- layout
  // FSDPParam::place: a group's shards are the padded row chunks of its parameters (aligned at
  // one rank, where the shard is the parameter); its unsharded buffer aligns every parameter.
  void layout() {
    nn::MiniLLM model(c_);  // shapes only: no tensor
    const int64_t n = o_.shards, align = nn::kFlatAlignElems;
    auto up = [&](int64_t x) { return (x + align - 1) / align * align; };
    auto place = [&](Group& g, const nn::Parameter& p) {
      const int64_t rows = p.shape[0], row = rows ? shape_numel(p.shape) / rows : 0;
      if (n == 1) g.G = up(g.G);
      g.G += dist::chunk_size(rows, n) * row;
      g.U = up(g.U) + rows * row;
      flat_ = up(flat_) + rows * row;  // nn::materialize's flat buffer, for --shard none
    };
    for (int64_t i = 0; i < L_; ++i) {
      Group g{.label = fmt::format("layers.{}", i)};
      for (auto& [name, p] : model.layers()[size_t(i)].named_parameters()) place(g, *p);
      groups_.push_back(g);
    }
    Group root{.label = "root"};
    for (auto& [name, p] : model.named_parameters())
      if (name.rfind("layers.", 0) != 0) place(root, *p);
    groups_.push_back(root);
  }
  Group& root() { return groups_.back(); }

  H alloc_batch() {
    // inputs and targets, i32 [B, T] each, in one handle's worth of bytes per tensor
    const H in = r_.alloc(R_ * 4, kData), tg = r_.alloc(R_ * 4, kData);
    batches_[in] = tg;
    return in;
  }
  void free_batch(H in) {
    r_.free(batches_[in]);
    r_.free(in);
  }

  // ---------------------------------------------------------------- ops (src/ops/cpu_ops.cpp)
  // An op holds widened copies of its inputs (CPU, storage dtype narrower than compute) until it
  // returns; its outputs are made in the compute dtype and narrowed back.
  struct Op {
    Step& s;
    std::vector<H> tmp;
    explicit Op(Step& st) : s(st) {}
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

  H linear(int64_t in, int64_t out, Term t = kActivations) {
    Op op(*this);
    op.in(R_ * in);
    op.in(out * in);
    return op.out(R_ * out, t);
  }
  // linear_backward: dx, and dW added into the gradient buffer.
  H linear_backward(int64_t in, int64_t out, Term t = kWork) {
    Op op(*this);
    op.in(R_ * out);
    op.in(R_ * in);
    op.in(out * in);
    op.grad(out * in);
    return op.out(R_ * in, t);
  }
  std::pair<H, H> rmsnorm() {
    Op op(*this);
    op.in(R_ * d_);
    const H y = op.out(R_ * d_, kActivations);
    return {y, op.stat(R_, kActivations)};
  }
  H rmsnorm_backward() {
    Op op(*this);
    op.in(R_ * d_);
    op.in(R_ * d_);
    op.in(R_);
    op.grad(d_);
    return op.out(R_ * d_, kWork);
  }
  H elementwise(int64_t inputs, int64_t elems, Term t) {  // add, silu, swiglu and backwards
    Op op(*this);
    for (int64_t i = 0; i < inputs; ++i) op.in(elems);
    return op.out(elems, t);
  }
  void add_inplace(int64_t elems) {  // add_: an Accum of a and a widened b
    Op op(*this);
    op.in(elems);
    op.in(elems);
  }
  void rope(int64_t width) {  // in place; the kernel's cos and sin tables
    if (c_.arch != nn::Arch::llama) return;
    Op op(*this);
    op.in(R_ * width);
    r_.scratch(2 * c_.seq * (hd_ / 2) * comp_);
  }
  // kernels/cpu/attention.cpp: kRows x T scores per thread (and as much again and a row in the
  // backward), outside the allocator.
  int64_t attention_scratch(bool backward) const {
    if (!cpu_) return 0;
    const int64_t rows = std::min<int64_t>(128, c_.seq);
    return int64_t(std::max(1, o_.threads)) * (backward ? 2 * rows * c_.seq + rows : rows * c_.seq) *
           comp_;
  }

  // ---------------------------------------------------------------- fully_shard's buffers
  void issue(Group& g) {  // FSDPParamGroup::unshard_issue
    if (!gathered_ || g.state != Group::sharded) return;
    if (act_ != master_) g.ag_in = r_.alloc(g.G * act_, kParams);  // the copy-in
    g.ag_out = r_.alloc(o_.shards * g.G * act_, kParams);
    g.state = Group::issued;
  }
  void wait(Group& g) {  // unshard_wait: copy-out into the unsharded buffer
    if (!gathered_ || g.state == Group::unsharded) return;
    issue(g);
    g.params = r_.alloc(g.U * act_, kParams);
    r_.free(std::exchange(g.ag_out, -1));
    r_.free(std::exchange(g.ag_in, -1));
    g.state = Group::unsharded;
  }
  void reshard(Group& g) {
    if (!gathered_ || g.state != Group::unsharded) return;
    r_.free(std::exchange(g.params, -1));
    g.state = Group::sharded;
  }
  void prepare_grads(Group& g) {
    if (gathered_ && !g.grads_kept) g.grads = r_.alloc(g.U * red_, kGrads);
  }
  // reduce_grads: chunk-cat into the reduce-scatter's input, its output, and at most one
  // reduce-scatter left in flight while the next block computes (FSDPCommContext).
  void reduce_grads(Group& g) {
    if (!gathered_) return;
    if (!sync_) {
      g.grads_kept = true;
      return;
    }
    g.grads_kept = false;
    const H in = r_.alloc(o_.shards * g.G * red_, kGrads);
    r_.free(std::exchange(g.grads, -1));
    const H out = r_.alloc(g.G * red_, kGrads);
    rs_.push_back({in, out, g.G});
    while (rs_.size() > 1) complete_oldest();
  }
  void complete_oldest() {
    const Pending p = rs_.front();
    rs_.erase(rs_.begin());
    if (o_.replicas > 1) {  // all-reduced over the replicas, added at the end of the backward
      replica_.push_back(p);
      r_.free(p.in);
      return;
    }
    add_into_sharded(p);
  }
  void add_into_sharded(const Pending& p) {
    {
      Op op(*this);
      if (cpu_ && red_ != comp_) op.tmp.push_back(r_.alloc(p.G * comp_, kWork));
    }
    r_.free(p.out);
    r_.free(p.in);
  }
  void finish_backward() {
    while (!rs_.empty()) complete_oldest();
    for (const Pending& p : replica_) add_into_sharded({-1, p.out, p.G});
    replica_.clear();
  }

  // FSDPState's hooks around a block (or the root).
  void pre_forward(int64_t i) {
    Group& g = groups_[size_t(i)];
    issue(g);
    if (i + 1 < L_) issue(groups_[size_t(i + 1)]);  // the next block: prefetch
    wait(g);
  }
  void post_forward(int64_t i) {
    if (o_.reshard_after_forward) reshard(groups_[size_t(i)]);
  }
  void pre_backward(int64_t i) {
    Group& g = groups_[size_t(i)];
    issue(g);
    if (i > 0) issue(groups_[size_t(i - 1)]);  // the block before it: prefetch
    wait(g);
    prepare_grads(g);
  }
  void post_backward(int64_t i) {
    Group& g = groups_[size_t(i)];
    reduce_grads(g);
    reshard(g);
  }

  // ---------------------------------------------------------------- the model (nn/layers.cpp)
  // TransformerBlock::forward_impl: returns the block's output; `s` gets what it saves.
  H block_forward(H x, Saved& s, const std::string& where) {
    s.x = x;
    r_.at(where + ".attn");
    std::tie(s.y1, s.rstd1) = rmsnorm();
    s.qkv = linear(d_, w_);
    rope(w_);
    {
      Op op(*this);
      op.in(R_ * w_);
      s.attn = op.out(R_ * q_, kActivations);
      s.lse = op.stat(c_.batch * nh_ * c_.seq, kActivations);
      r_.scratch(attention_scratch(false));
    }
    const H o = linear(q_, d_, kWork);
    s.h = elementwise(2, R_ * d_, kActivations);
    r_.free(o);
    r_.at(where + ".ffn");
    std::tie(s.y2, s.rstd2) = rmsnorm();
    if (c_.arch == nn::Arch::llama) {
      s.f1 = linear(d_, F_);
      s.f2 = linear(d_, F_);
      s.f3 = elementwise(2, R_ * F_, kActivations);
    } else {
      s.f1 = linear(d_, F_);
      s.f2 = elementwise(1, R_ * F_, kActivations);
    }
    const H f = linear(F_, d_, kWork);
    const H out = elementwise(2, R_ * d_, kActivations);
    r_.free(f);
    return out;
  }
  void release(Saved& s) {  // Module::release_saved over the block, all but its input
    for (H* h : {&s.y1, &s.rstd1, &s.qkv, &s.attn, &s.lse, &s.h, &s.rstd2, &s.y2, &s.f1, &s.f2,
                 &s.f3})
      r_.free(std::exchange(*h, -1));
  }
  // TransformerBlock::backward_impl(dy): returns dx; frees what the block saved, its input too.
  H block_backward(Saved& s, const std::string& where) {
    r_.at(where + ".ffn");
    H dxf;
    if (c_.arch == nn::Arch::llama) {
      const H dh = linear_backward(F_, d_);
      r_.free(std::exchange(s.f3, -1));
      H dg, du;
      {
        Op op(*this);
        for (int k = 0; k < 3; ++k) op.in(R_ * F_);
        dg = op.out(R_ * F_, kWork);
        du = op.out(R_ * F_, kWork);
      }
      r_.free(std::exchange(s.f1, -1));
      r_.free(std::exchange(s.f2, -1));
      dxf = linear_backward(d_, F_);
      const H t = linear_backward(d_, F_);
      r_.free(std::exchange(s.y2, -1));
      add_inplace(R_ * d_);
      r_.free(t);
      r_.free(du);
      r_.free(dg);
      r_.free(dh);
    } else {
      const H dh = linear_backward(F_, d_);
      r_.free(std::exchange(s.f2, -1));
      const H ds = elementwise(2, R_ * F_, kWork);
      dxf = linear_backward(d_, F_);
      r_.free(std::exchange(s.y2, -1));
      r_.free(ds);
      r_.free(std::exchange(s.f1, -1));
      r_.free(dh);
    }
    const H dh2 = rmsnorm_backward();
    r_.free(std::exchange(s.h, -1));
    r_.free(std::exchange(s.rstd2, -1));
    r_.free(dxf);
    add_inplace(R_ * d_);
    r_.at(where + ".attn");
    const H dattn = linear_backward(q_, d_);
    H dqkv;
    {
      Op op(*this);
      op.in(R_ * q_);
      op.in(R_ * w_);
      op.in(R_ * q_);
      op.in(c_.batch * nh_ * c_.seq);
      dqkv = op.out(R_ * w_, kWork);
      r_.scratch(attention_scratch(true));
    }
    rope(w_);
    const H dxa = linear_backward(d_, w_);
    for (H* h : {&s.y1, &s.qkv, &s.attn, &s.lse}) r_.free(std::exchange(*h, -1));
    r_.free(dqkv);
    r_.free(dattn);
    const H dx = rmsnorm_backward();
    r_.free(std::exchange(s.x, -1));
    r_.free(std::exchange(s.rstd1, -1));
    r_.free(dxa);
    add_inplace(R_ * d_);
    r_.free(dh2);
    return dx;
  }

  bool checkpointed(int64_t i) const {
    return o_.checkpoint_every > 0 && i % o_.checkpoint_every == 0;
  }

  // One microbatch: MiniLLM's forward, LMLoss, MiniLLM's backward (nn/minillm.cpp, nn/loss.cpp),
  // with the root's hooks around them.
  void microbatch() {
    Group& rg = root();
    // Root pre-forward: its all-gather, the first block's prefetched, then its wait.
    r_.at("forward of the embedding");
    issue(rg);
    issue(groups_[0]);
    wait(rg);
    H x;
    {
      Op op(*this);
      op.in(V_ * d_);
      x = op.out(R_ * d_, kActivations);
    }
    std::vector<Saved> saved(static_cast<size_t>(L_));
    for (int64_t i = 0; i < L_; ++i) {
      const std::string where = fmt::format("forward of layers.{}", i);
      r_.at(where);
      pre_forward(i);
      x = block_forward(x, saved[size_t(i)], where);
      if (checkpointed(i)) release(saved[size_t(i)]);
      post_forward(i);
    }
    r_.at("forward of the head");
    H xn = x, rstd_n = -1;  // the head's input
    if (c_.arch == nn::Arch::llama) std::tie(xn, rstd_n) = rmsnorm();
    const H logits = linear(d_, V_, kLogits);
    // LMLoss: the cross-entropy's lse; its backward overwrites the logits with dlogits (widened
    // copies where the logits are narrower than the compute dtype).
    r_.at("loss");
    H lse;
    {
      Op op(*this);
      op.in(R_ * V_);
      lse = op.stat(R_, kLogits);
    }
    {
      Op op(*this);
      op.in(R_ * V_);
    }
    r_.free(lse);
    // Root pre-backward: nothing to gather (the root stays unsharded), the last block prefetched,
    // the root's gradient buffer.
    r_.at("backward of the head");
    issue(groups_[size_t(L_ - 1)]);
    prepare_grads(rg);
    H top = linear_backward(d_, V_);  // head (or tied: the embedding's weight)
    r_.free(xn);
    if (c_.arch == nn::Arch::llama) {
      const H dn = rmsnorm_backward();
      r_.free(x);
      r_.free(rstd_n);
      r_.free(top);
      top = dn;
    }
    H g = top;
    for (int64_t i = L_ - 1; i >= 0; --i) {
      const std::string where = fmt::format("backward of layers.{}", i);
      r_.at(where);
      pre_backward(i);
      Saved& s = saved[size_t(i)];
      if (checkpointed(i)) r_.free(block_forward(s.x, s, where + " (recompute)"));
      const H dx = block_backward(s, where);
      post_backward(i);
      if (g != top) r_.free(g);
      g = dx;
    }
    r_.at("backward of the embedding");
    {
      Op op(*this);
      op.in(R_ * d_);
      op.grad(V_ * d_);
    }
    r_.free(g);
    r_.free(top);
    r_.at("end of the backward");
    reduce_grads(rg);
    reshard(rg);
    finish_backward();
    r_.free(logits);
  }

  const MemoryPlanOptions& o_;
  const nn::MiniLLMConfig& c_;
  bool cpu_;
  Replay r_;
  int64_t R_, d_, F_, hd_, nh_, kv_, V_, L_, q_ = 0, w_ = 0;
  int64_t master_ = 4, act_ = 4, red_ = 4, comp_ = 4, stat_ = 4, grad_ = 4;
  bool narrow_ = false, gathered_ = false, sync_ = true;
  std::vector<Group> groups_;  // blocks 0..L-1, then the root
  int64_t flat_ = 0, persistent_ = 0;
  std::vector<Pending> rs_, replica_;
  std::map<H, H> batches_;
};

}  // namespace

MemoryPlan plan_memory(const MemoryPlanOptions& o) {
  o.model.validate();
  FSDP_CHECK(o.shards >= 1 && o.replicas >= 1 && o.grad_accum >= 1 && o.checkpoint_every >= 0 &&
                 o.threads >= 0 && o.cpu_cache_bytes >= 0 && o.baseline_bytes >= 0,
             "[memory plan] shards {}, replicas {}, grad_accum {}, checkpoint_every {}, threads {}, "
             "cache {} and baseline {} bytes: expected >= 1, >= 1, >= 1 and >= 0 for the rest",
             o.shards, o.replicas, o.grad_accum, o.checkpoint_every, o.threads, o.cpu_cache_bytes,
             o.baseline_bytes);
  FSDP_CHECK(o.fully_shard || (o.shards == 1 && o.replicas == 1 && !o.param_dtype &&
                               !o.reduce_dtype),
             "[memory plan] shards, replicas and dtype policies are fully_shard's");
  return Step(o).run();
}

int64_t resident_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

}  // namespace fsdp::train
