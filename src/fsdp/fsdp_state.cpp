#include "src/fsdp/fsdp_state.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>

#include "fsdp/core/trace.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/module.h"

namespace fsdp {

// ---------------------------------------------------------------- FSDPCommContext

void FSDPCommContext::wait(const std::shared_ptr<dist::Work>& w) {
  trace::Scope prof("FSDP::wait", trace::Kind::annotation);
  const auto t0 = std::chrono::steady_clock::now();
  w->wait();
  exposed_ns_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
}

void FSDPCommContext::queue_reduce_scatter(FSDPParamGroup* group, PendingCollective rs) {
  rs_inflight_.emplace_back(group, std::move(rs));
  while (rs_inflight_.size() > 1) complete_oldest_reduce();
}

// Waits for the oldest reduce-scatter and adds it into its sharded grads;
// under HSDP it first all-reduces over the replicas (asynchronously).
void FSDPCommContext::complete_oldest_reduce() {
  auto [g, p] = std::move(rs_inflight_.front());
  rs_inflight_.pop_front();
  wait(p.work);
  log("rs_wait", g->label());
  if (auto replica = g->finish_reduce_scatter(p.out)) replica_inflight_.emplace_back(g, *replica);
}

void FSDPCommContext::finish_backward() {
  while (!rs_inflight_.empty()) complete_oldest_reduce();
  for (auto& [g, p] : replica_inflight_) {
    wait(p.work);
    g->add_into_sharded_grad(p.out);
  }
  replica_inflight_.clear();
}

void FSDPCommContext::log(const char* what, const std::string& label) {
  std::lock_guard<std::mutex> lock(log_mu_);
  if (log_on_) log_.push_back(std::string(what) + ":" + label);
}

void FSDPCommContext::set_log(bool on) {
  std::lock_guard<std::mutex> lock(log_mu_);
  log_on_ = on;
  log_.clear();
}

std::vector<std::string> FSDPCommContext::take_log() {
  std::lock_guard<std::mutex> lock(log_mu_);
  return std::exchange(log_, {});
}

// ---------------------------------------------------------------- FSDPState

namespace {
std::string label_of(const nn::Module& m) {
  const std::string p = m.path();
  return p.empty() ? "<root>" : p;
}

FSDPState* next_in(const std::vector<FSDPState*>& order, const FSDPState* s, int step) {
  auto it = std::find(order.begin(), order.end(), s);
  if (it == order.end()) return nullptr;
  const auto idx = (it - order.begin()) + step;
  if (idx < 0 || idx >= int64_t(order.size())) return nullptr;
  return order[size_t(idx)];
}
}  // namespace

const char* training_state_name(TrainingState s) {
  switch (s) {
    case TrainingState::idle:
      return "idle";
    case TrainingState::forward:
      return "forward";
    case TrainingState::pre_backward:
      return "pre_backward";
  }
  return "?";
}

namespace {
void expect_state(const FSDPState& st, TrainingState want, const char* hook) {
  FSDP_CHECK(st.training_state == want, "[fully_shard] '{}': {} hook in state {} (expected {}){}",
             label_of(*st.module), hook, training_state_name(st.training_state),
             training_state_name(want),
             st.training_state == TrainingState::pre_backward && want == TrainingState::idle
                 ? ": a forward inside the module's own backward (an activation recompute must "
                   "call forward_impl, whose parameters the pre-backward hook already gathered)"
                 : "");
}
}  // namespace

FSDPState::FSDPState(nn::Module& m, std::shared_ptr<dist::DeviceMesh> mesh_,
                     const FullyShardOptions& opt_, std::vector<FSDPParam> params)
    : module(&m),
      mesh(mesh_),
      opt(opt_),
      label(label_of(m)),
      reshard_after_forward(opt_.reshard_after_forward) {
  std::vector<FSDPParam> trainable, frozen, packed;
  for (FSDPParam& fp : params) {
    if (fp.param->requires_grad) {
      trainable.push_back(std::move(fp));
      continue;
    }
    if (opt.frozen_packed) fp.packed = opt.frozen_packed(fp.name);
    (fp.packed ? packed : frozen).push_back(std::move(fp));
  }
  groups.reserve(3);
  groups.emplace_back(std::move(trainable), mesh, opt, label, false);
  FullyShardOptions fo = opt;
  fo.init_dtype = opt.frozen_dtype.value_or(opt.init_dtype);
  if (!frozen.empty()) groups.emplace_back(std::move(frozen), mesh, fo, label + " (frozen)", true);
  if (!packed.empty())
    groups.emplace_back(std::move(packed), mesh, fo, label + " (frozen, packed)", true);
}

void FSDPState::unshard_issue(FSDPCommContext& c) {
  for (FSDPParamGroup& g : groups) g.unshard_issue(c);
}
void FSDPState::unshard_wait(FSDPCommContext& c) {
  for (FSDPParamGroup& g : groups) g.unshard_wait(c);
}
void FSDPState::reshard(FSDPCommContext& c) {
  for (FSDPParamGroup& g : groups) g.reshard(c);
}

FSDPCommContext& FSDPState::comm() {
  if (!root) lazy_init_root();
  return root->root_ctx->comm;
}

void FSDPState::lazy_init_root() {
  root = this;
  if (!root_ctx) root_ctx = std::make_unique<FSDPRootContext>();
  root_ctx->states.clear();
  module->for_each_module([&](nn::Module& m) {
    if (FSDPModule* s = fsdp_state(m)) {
      FSDPState& st = s->state();
      st.root = this;
      if (&st != this) st.root_ctx.reset();  // an inner state used alone before stops being a root
      root_ctx->states.push_back(&st);
    }
  });
}

std::vector<FSDPState*> FSDPState::forward_prefetch_targets() const {
  if (explicit_fwd) return fwd_prefetch;
  if (!root) return {};
  const FSDPRootContext& r = *root->root_ctx;
  FSDPState* next = nullptr;
  if (!r.prev_fwd_order.empty()) {
    next = next_in(r.prev_fwd_order, this, +1);
  } else {  // first iteration: the next sharded module in the tree
    next = next_in(r.states, this, +1);
    if (next == root) next = nullptr;
  }
  return next ? std::vector<FSDPState*>{next} : std::vector<FSDPState*>{};
}

std::vector<FSDPState*> FSDPState::backward_prefetch_targets() const {
  if (explicit_bwd) return bwd_prefetch;
  if (!root) return {};
  FSDPState* prev = next_in(root->root_ctx->post_fwd_order, this, -1);
  return prev ? std::vector<FSDPState*>{prev} : std::vector<FSDPState*>{};
}

Tensor FSDPState::pre_forward(const Tensor& x) {
  // From idle; or after a forward that threw part-way (its post-forward never ran).
  if (training_state != TrainingState::forward)
    expect_state(*this, TrainingState::idle, "pre-forward");
  FSDP_CHECK(module->batch_context().microbatch == 0,
             "[fully_shard] '{}': forward of microbatch {}; a fully_shard model takes one "
             "microbatch in flight (BatchContext::microbatch 0): run each microbatch's forward "
             "and backward before the next",
             label, module->batch_context().microbatch);
  training_state = TrainingState::forward;
  if (!root) lazy_init_root();
  FSDPRootContext& r = *root->root_ctx;
  if (is_root()) {
    // On CPU the optimizer step ran on this thread, so every all-gather
    // issued from here on reads the updated shards.
    r.prev_fwd_order = std::exchange(r.fwd_order, {});
    r.post_fwd_order.clear();
  }
  // A module called again in this forward (shared weights) is gathered again; the orders keep
  // its first call only, so no prefetch reaches a module whose last use has passed.
  const bool again = std::find(r.fwd_order.begin(), r.fwd_order.end(), this) != r.fwd_order.end();
  if (!again) r.fwd_order.push_back(this);
  unshard_issue(r.comm);
  if (!again)
    for (FSDPState* t : forward_prefetch_targets()) t->unshard_issue(r.comm);
  unshard_wait(r.comm);
  r.comm.log("fwd_begin", label);
  if (opt.mp_policy.param_dtype && is_floating(x.dtype()) &&
      x.dtype() != *opt.mp_policy.param_dtype)
    return x.to(*opt.mp_policy.param_dtype);
  return x;
}

Tensor FSDPState::post_forward(const Tensor& y) {
  expect_state(*this, TrainingState::forward, "post-forward");
  training_state = TrainingState::idle;
  FSDPRootContext& r = *root->root_ctx;
  r.comm.log("fwd_end", label);
  if (std::find(r.post_fwd_order.begin(), r.post_fwd_order.end(), this) == r.post_fwd_order.end())
    r.post_fwd_order.push_back(this);
  if (!is_root() && reshard_after_forward) reshard(r.comm);
  if (opt.mp_policy.output_dtype && is_floating(y.dtype()))
    return y.to(*opt.mp_policy.output_dtype);
  return y;
}

void FSDPState::pre_backward() {
  if (training_state != TrainingState::pre_backward)  // (again after a backward that threw)
    expect_state(*this, TrainingState::idle, "pre-backward");
  training_state = TrainingState::pre_backward;
  FSDPCommContext& c = comm();
  unshard_issue(c);
  for (FSDPState* t : backward_prefetch_targets()) t->unshard_issue(c);
  unshard_wait(c);
  for (FSDPParamGroup& g : groups) g.prepare_grads();
  c.log("bwd_begin", label);
}

void FSDPState::post_backward() {
  expect_state(*this, TrainingState::pre_backward, "post-backward");
  training_state = TrainingState::idle;
  FSDPCommContext& c = comm();
  c.log("bwd_end", label);
  // Records left in the subtree are another call's of this step (a module called twice; the
  // root's forward drops older ones): its gradients add into the kept unsharded ones, reduced
  // once after the last backward, as FSDP2 does.
  size_t pending = 0;
  module->for_each_module([&](nn::Module& m) { pending += m.saved_records(); });
  for (FSDPParamGroup& g : groups) pending ? g.keep_grads() : g.reduce_grads(c);
  if (reshard_after_backward) reshard(c);
  if (!is_root()) return;
  c.finish_backward();
  // Every call's backward has run by the root's: a module still waiting for one ran a forward
  // inside it whose backward never came (a module called for its output only), and its records
  // held the gradients back from their reduce-scatter. Stop rather than step on gradients that
  // were never reduced.
  module->for_each_module([](nn::Module& m) {
    if (FSDPModule* s = fsdp_state(m))
      for (const FSDPParamGroup& g : s->state().groups)
        FSDP_CHECK(!g.awaits_backward(),
                   "[fully_shard] {}: a forward inside it left saved records whose backward never "
                   "ran this step (a module called for its output only), so its gradients were "
                   "kept for a backward that did not come and never reduced; run that module's "
                   "backward, or call it outside the sharded module",
                   s->state().label);
  });
  // A group no gradient reached this step (a module the forward skipped) still reads zeros.
  module->for_each_module([](nn::Module& m) {
    if (FSDPModule* s = fsdp_state(m))
      for (FSDPParamGroup& g : s->state().groups) g.settle_grad();
  });
}

}  // namespace fsdp
