// fully_shard's runtime: FSDPParam (one parameter's shard), the group state
// (flat sharded buffers, unshard/reshard, gradient reduction) and the hooks.
//
// Layouts, with N ranks on the shard dim and G the group's padded shard size:
//   sharded        [G]      master dtype: each parameter's rows of chunk r, padded to the largest
//   chunk all-gather out [N * G]  param_dtype, rank-major: block k is rank k's `sharded` unsharded
//   [U]      param_dtype: each parameter whole and contiguous (copied out of the
//                           all-gather output: per-parameter shards cannot be strided views of it)
//   grads          [U]      reduce_dtype, the modules' backward adds into these
//   reduce-scatter in [N * G] reduce_dtype, rank-major (the "chunk-cat" of the grads)
// With one rank and no dtype change there is nothing to gather or reduce, and
// the parameters and gradients are views of the sharded buffers themselves.
//
// Streams and events on CUDA (NCCL), as this code runs today:
//   compute stream (one per device, cuda_compute_stream): every kernel,
//     including the copy-in to param_dtype, the copy-out of the all-gather
//     output and the reduce-scatter chunk-cat;
//   the all-gather group's NCCL stream and the reduce-scatter group's NCCL
//     stream (fully_shard gives each its own communicator, so the two overlap
//     each other and the compute);
//   a collective first waits on an event recorded on the compute stream at
//     issue (its input is ready), and Work::wait() makes the compute stream
//     wait on an event recorded after it on its NCCL stream; the host never
//     blocks (only the step's loss read does);
//   buffers: a Work keeps its tensors alive until it is waited on, and a
//     freed block returns to the compute stream's pool, whose later users are
//     ordered after that wait: a block cannot be reused while NCCL still
//     reads or writes it.
// So the next group's all-gather runs under this group's compute, and the
// reduce-scatter of group i under the backward of group i - 1. Unlike FSDP2,
// the copy-out runs on the compute stream rather than the all-gather stream:
// it is a memory-bound kernel of the unsharded size (fsdp-bench-kernels times
// it against its floor). On CPU groups (MPI, Gloo) the communication threads
// play the streams and Work::wait() blocks the host instead.
#include "fsdp/fsdp/fully_shard.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <map>
#include <mutex>
#include <tuple>

#include "fsdp/core/trace.h"
#include "fsdp/nn/init.h"
#include "fsdp/ops/ops.h"

namespace fsdp {

namespace {

std::atomic<int64_t> exposed_ns{0};  // compute thread blocked on FSDP collectives

// Waits for a work item and counts the time as exposed communication.
void timed_wait(const std::shared_ptr<dist::Work>& w) {
  trace::Scope prof("FSDP::wait", trace::Kind::annotation);
  const auto t0 = std::chrono::steady_clock::now();
  w->wait();
  exposed_ns +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
}

std::mutex log_mu;
bool log_on = false;
std::vector<std::string> log_events;

void log_event(const char* what, const std::string& label) {
  if (!log_on) return;
  std::lock_guard<std::mutex> lock(log_mu);
  log_events.push_back(std::string(what) + ":" + label);
}

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace

void set_event_log(bool on) {
  std::lock_guard<std::mutex> lock(log_mu);
  log_on = on;
  log_events.clear();
}

std::vector<std::string> take_event_log() {
  std::lock_guard<std::mutex> lock(log_mu);
  return std::exchange(log_events, {});
}

struct FSDPParam {
  std::string name;
  nn::Parameter* param = nullptr;
  int64_t dim0 = 0, row = 0;  // global rows and elements per row
  int64_t padded_rows = 0;    // rows of the largest chunk
  int64_t local_begin = 0, local_rows = 0;
  int64_t shard_offset = 0;      // in the sharded buffer
  int64_t unsharded_offset = 0;  // in the unsharded buffer
};

struct FSDPModule::Impl {
  nn::Module* module = nullptr;
  FSDPModule* self = nullptr;
  std::shared_ptr<dist::DeviceMesh> mesh;
  FullyShardOptions opt;
  std::shared_ptr<dist::ProcessGroup> shard_group, replicate_group, ag_group, rs_group;
  int N = 1, rank = 0;
  std::vector<FSDPParam> params;
  DType master = DType::f32, param_dtype = DType::f32, reduce_dtype = DType::f32;
  int64_t G = 0, U = 0;
  Tensor sharded, sharded_grad;
  bool direct = false;  // one rank, same dtypes: parameters are views of `sharded`

  // unshard state
  std::shared_ptr<dist::Work> ag_work;
  Tensor ag_out, unsharded, unsharded_grad;
  bool unsharded_ready = false, grads_kept = false, shapes_checked = false;
  struct Pending {
    std::shared_ptr<dist::Work> work;
    Tensor out;
  };

  bool reshard_after_forward = true, reshard_after_backward = true, requires_sync = true;
  bool explicit_fwd = false, explicit_bwd = false;
  std::vector<Impl*> fwd_prefetch, bwd_prefetch;

  // root only
  bool is_root = false;
  Impl* root = nullptr;
  std::vector<Impl*> states, fwd_order, prev_fwd_order, post_fwd_order;
  std::deque<std::pair<Impl*, Pending>> rs_inflight;  // reduce-scatters issued, not yet waited for
  std::vector<std::pair<Impl*, Pending>> replica_inflight;  // HSDP all-reduces

  std::string label() const {
    std::string p = module->path();
    return p.empty() ? "<root>" : p;
  }

  // ---------------------------------------------------------------- setup

  // The parameters of `m`'s subtree that no inner fully_shard owns, with full names.
  void collect(nn::Module& m, const std::string& prefix, bool top) {
    if (!top && fsdp_state(m)) return;
    for (auto& [name, p] : m.direct_parameters())
      params.push_back(FSDPParam{join_name(prefix, name), p});
    for (auto& [cname, child] : m.named_children())
      collect(*child, join_name(prefix, cname), false);
  }

  void init_shards() {
    const Device dev = mesh->device();
    bool has_values = false;
    for (auto& fp : params) {
      nn::Parameter& p = *fp.param;
      FSDP_CHECK(!p.shape.empty(),
                 "[fully_shard] parameter '{}' is 0-dim; fully_shard shards dim 0 and needs at "
                 "least one dim",
                 fp.name);
      if (p.data.defined()) {
        FSDP_CHECK(p.data.device() == dev,
                   "[fully_shard] parameter '{}' is on {} but the mesh is on {}", fp.name,
                   p.data.device().str(), dev.str());
        if (!has_values) master = p.data.dtype();
        has_values = true;
      }
    }
    if (!has_values) master = opt.init_dtype;
    FSDP_CHECK(is_floating(master), "[fully_shard] parameters must be floating, got {}",
               dtype_name(master));
    param_dtype = opt.mp_policy.param_dtype.value_or(master);
    reduce_dtype = opt.mp_policy.reduce_dtype.value_or(param_dtype);

    for (auto& fp : params) {
      nn::Parameter& p = *fp.param;
      fp.dim0 = p.shape[0];
      fp.row = fp.dim0 ? shape_numel(p.shape) / fp.dim0 : 0;
      fp.padded_rows = dist::chunk_size(fp.dim0, N);
      std::tie(fp.local_begin, fp.local_rows) = dist::chunk_range(fp.dim0, N, rank);
      fp.shard_offset = G;
      G += fp.padded_rows * fp.row;
      fp.unsharded_offset = U;
      U += fp.dim0 * fp.row;
    }
    sharded = Tensor::zeros({G}, master, dev);  // padding stays zero
    sharded_grad = Tensor::zeros({G}, master, dev);
    for (auto& fp : params) {
      nn::Parameter& p = *fp.param;
      Tensor local = local_shard(fp);
      if (p.data.defined()) {
        if (fp.local_rows > 0)
          local.copy_(
              p.data.narrow(0, fp.local_begin, fp.local_rows).reshape({fp.local_rows * fp.row}));
      } else {
        nn::init_fill(p.init, opt.seed, fp.name, fp.local_begin * fp.row, local);
      }
      p.data = Tensor();  // nothing unsharded until the first unshard
      p.grad = Tensor();
    }
    direct = N == 1 && !replicate_group && param_dtype == master && reduce_dtype == master;
  }

  Tensor local_shard(const FSDPParam& fp) const {
    return sharded.slice(fp.shard_offset, fp.shard_offset + fp.local_rows * fp.row);
  }

  // Detects ranks whose parameters differ, at the first unshard, and names the parameter.
  void check_shapes_once() {
    if (shapes_checked || N == 1) return;
    shapes_checked = true;
    Tensor count = Tensor::full({1}, double(params.size()), DType::i64);
    Tensor counts = Tensor::empty({N}, DType::i64);
    shard_group->all_gather_into_tensor(counts, count)->wait();
    for (int k = 0; k < N; ++k)
      FSDP_CHECK(counts.data<int64_t>()[k] == int64_t(params.size()),
                 "[fully_shard] {} holds {} parameters on rank {} but {} on rank {}", label(),
                 params.size(), rank, counts.data<int64_t>()[k], k);
    Tensor mine = Tensor::empty({int64_t(params.size()), 2}, DType::i64);
    for (size_t i = 0; i < params.size(); ++i) {
      mine.data<int64_t>()[2 * i] = params[i].dim0;
      mine.data<int64_t>()[2 * i + 1] = params[i].row;
    }
    Tensor all = Tensor::empty({N * int64_t(params.size()), 2}, DType::i64);
    shard_group->all_gather_into_tensor(all, mine)->wait();
    for (int k = 0; k < N; ++k)
      for (size_t i = 0; i < params.size(); ++i) {
        const int64_t* o = all.data<int64_t>() + 2 * (size_t(k) * params.size() + i);
        FSDP_CHECK(
            o[0] == params[i].dim0 && o[1] == params[i].row,
            "[fully_shard] parameter '{}' has shape {} on rank {} but {} rows x {} on rank {}",
            params[i].name, shape_str(params[i].param->shape), rank, o[0], o[1], k);
      }
  }

  // ---------------------------------------------------------------- unshard / reshard

  void unshard_issue() {
    if (params.empty() || unsharded_ready || ag_work || direct) return;
    check_shapes_once();
    Tensor in = sharded.to(param_dtype);  // copy-in (no copy when the dtypes match)
    ag_out = Tensor::empty({int64_t(N) * G}, param_dtype, sharded.device());
    ag_work = ag_group->all_gather_into_tensor(ag_out, in);
    log_event("ag_issue", label());
  }

  void unshard_wait() {
    if (params.empty() || unsharded_ready) return;
    trace::Scope prof(("FSDP::unshard " + label()).c_str(), trace::Kind::annotation);
    if (direct) {
      for (auto& fp : params) fp.param->data = local_shard(fp).view(fp.param->shape);
      unsharded_ready = true;
      return;
    }
    if (!ag_work) unshard_issue();
    timed_wait(ag_work);
    log_event("ag_wait", label());
    unsharded = Tensor::empty({U}, param_dtype, sharded.device());
    std::vector<ops::Segment> copy_out;  // rank k's rows of each parameter, in one launch
    for (auto& fp : params) {
      for (int k = 0; k < N; ++k) {
        auto [b, len] = dist::chunk_range(fp.dim0, N, k);
        if (len > 0)
          copy_out.push_back(
              {fp.unsharded_offset + b * fp.row, int64_t(k) * G + fp.shard_offset, len * fp.row});
      }
      fp.param->data = unsharded.slice(fp.unsharded_offset, fp.unsharded_offset + fp.dim0 * fp.row)
                           .view(fp.param->shape);
    }
    ops::copy_segments(unsharded, ag_out, copy_out);
    ag_out = Tensor();
    ag_work = nullptr;
    unsharded_ready = true;
  }

  void do_reshard() {
    if (params.empty() || !unsharded_ready) return;
    trace::Scope prof(("FSDP::reshard " + label()).c_str(), trace::Kind::annotation);
    for (auto& fp : params) fp.param->data = Tensor();
    unsharded = Tensor();  // back to the allocator
    unsharded_ready = false;
    log_event("reshard", label());
  }

  // ---------------------------------------------------------------- gradients

  void prepare_grads() {
    if (params.empty()) return;
    if (direct) {
      for (auto& fp : params)
        fp.param->grad = sharded_grad.slice(fp.shard_offset, fp.shard_offset + fp.dim0 * fp.row)
                             .view(fp.param->shape);
      return;
    }
    if (!grads_kept) unsharded_grad = Tensor::zeros({U}, reduce_dtype, sharded.device());
    for (auto& fp : params)
      fp.param->grad =
          unsharded_grad.slice(fp.unsharded_offset, fp.unsharded_offset + fp.dim0 * fp.row)
              .view(fp.param->shape);
  }

  void reduce_grads() {
    if (params.empty()) return;
    if (direct) {
      for (auto& fp : params) fp.param->grad = Tensor();
      return;
    }
    for (auto& fp : params) fp.param->grad = Tensor();
    if (!requires_sync) {  // accumulate over microbatches; reduce on the one that syncs
      grads_kept = true;
      return;
    }
    grads_kept = false;
    trace::Scope prof(("FSDP::reduce_scatter " + label()).c_str(), trace::Kind::annotation);
    Tensor in = Tensor::zeros({int64_t(N) * G}, reduce_dtype, sharded.device());
    std::vector<ops::Segment> chunk_cat;  // rank k's rows of each gradient into block k
    for (auto& fp : params)
      for (int k = 0; k < N; ++k) {
        auto [b, len] = dist::chunk_range(fp.dim0, N, k);
        if (len > 0)
          chunk_cat.push_back(
              {int64_t(k) * G + fp.shard_offset, fp.unsharded_offset + b * fp.row, len * fp.row});
      }
    ops::copy_segments(in, unsharded_grad, chunk_cat);
    unsharded_grad = Tensor();
    Tensor out = Tensor::empty({G}, reduce_dtype, sharded.device());
    Impl* r = root ? root : this;
    r->rs_inflight.push_back(
        {this, {rs_group->reduce_scatter_tensor(out, in, dist::ReduceOp::AVG), out}});
    log_event("rs_issue", label());
    // Keep one reduce-scatter queued behind this one at most: the one issued
    // by the previous group is finished now, while this group's runs during
    // the next group's backward (FSDP2 frees its reduce-scatter buffers the same way).
    while (r->rs_inflight.size() > 1) r->complete_oldest_reduce();
  }

  // Waits for the oldest reduce-scatter and adds it into its sharded grads;
  // under HSDP it first all-reduces over the replicas (asynchronously).
  void complete_oldest_reduce() {
    auto [s, p] = rs_inflight.front();
    rs_inflight.pop_front();
    timed_wait(p.work);
    log_event("rs_wait", s->label());
    if (s->replicate_group) {
      replica_inflight.push_back(
          {s, {s->replicate_group->all_reduce(p.out, dist::ReduceOp::AVG), p.out}});
    } else {
      ops::add_(s->sharded_grad, p.out);
    }
  }

  // ---------------------------------------------------------------- prefetch targets

  Impl* next_in(const std::vector<Impl*>& order, int step) const {
    auto it = std::find(order.begin(), order.end(), this);
    if (it == order.end()) return nullptr;
    const auto idx = (it - order.begin()) + step;
    if (idx < 0 || idx >= int64_t(order.size())) return nullptr;
    return order[size_t(idx)];
  }

  std::vector<Impl*> forward_prefetch_targets() const {
    if (explicit_fwd) return fwd_prefetch;
    if (!root) return {};
    Impl* next = root->prev_fwd_order.empty() ? nullptr : next_in(root->prev_fwd_order, +1);
    if (root->prev_fwd_order.empty()) {  // first iteration: the next sharded module in the tree
      next = next_in(root->states, +1);
      if (next == root) next = nullptr;
    }
    return next ? std::vector<Impl*>{next} : std::vector<Impl*>{};
  }

  std::vector<Impl*> backward_prefetch_targets() const {
    if (explicit_bwd) return bwd_prefetch;
    if (!root) return {};
    Impl* prev = next_in(root->post_fwd_order, -1);
    return prev ? std::vector<Impl*>{prev} : std::vector<Impl*>{};
  }

  // ---------------------------------------------------------------- root

  void lazy_init_root() {
    is_root = true;
    root = this;
    states.clear();
    module->for_each_module([&](nn::Module& m) {
      if (FSDPModule* s = fsdp_state(m)) {
        Impl& st = s->impl();
        st.root = this;
        if (&st != this) st.is_root = false;
        states.push_back(&st);
      }
    });
  }

  void finish_backward() {
    while (!rs_inflight.empty()) complete_oldest_reduce();
    for (auto& [s, p] : replica_inflight) {
      timed_wait(p.work);
      ops::add_(s->sharded_grad, p.out);
    }
    replica_inflight.clear();
  }
};

// ---------------------------------------------------------------- FSDPModule

FSDPModule::FSDPModule(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) { impl_->self = this; }
FSDPModule::~FSDPModule() = default;

nn::Module& FSDPModule::module() const { return *impl_->module; }

void UnshardHandle::wait() { m_->impl().unshard_wait(); }

std::shared_ptr<UnshardHandle> FSDPModule::unshard(bool async) {
  impl_->unshard_issue();
  if (!async) impl_->unshard_wait();
  return std::make_shared<UnshardHandle>(this);
}

void FSDPModule::reshard() { impl_->do_reshard(); }

namespace {
std::vector<FSDPModule::Impl*> subtree_states(nn::Module& m) {
  std::vector<FSDPModule::Impl*> out;
  m.for_each_module([&](nn::Module& x) {
    if (FSDPModule* s = fsdp_state(x)) out.push_back(&s->impl());
  });
  return out;
}
}  // namespace

void FSDPModule::set_requires_gradient_sync(bool sync) {
  for (Impl* s : subtree_states(*impl_->module)) s->requires_sync = sync;
}
void FSDPModule::set_reshard_after_backward(bool reshard) {
  impl_->reshard_after_backward = reshard;
}
void FSDPModule::set_reshard_after_forward(bool reshard) { impl_->reshard_after_forward = reshard; }

void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule*>& modules) {
  impl_->explicit_fwd = true;
  impl_->fwd_prefetch.clear();
  for (FSDPModule* m : modules) impl_->fwd_prefetch.push_back(&m->impl());
}

void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule*>& modules) {
  impl_->explicit_bwd = true;
  impl_->bwd_prefetch.clear();
  for (FSDPModule* m : modules) impl_->bwd_prefetch.push_back(&m->impl());
}

std::vector<nn::ParamGroup> FSDPModule::param_groups(double weight_decay, bool decay_1d) {
  std::vector<nn::ParamGroup> out;
  for (Impl* s : subtree_states(*impl_->module)) {
    if (s->params.empty()) continue;
    nn::ParamGroup g{s->sharded, s->sharded_grad, weight_decay};
    if (!decay_1d)
      for (auto& fp : s->params)
        if (fp.param->shape.size() == 1)
          g.no_decay.emplace_back(fp.shard_offset, fp.padded_rows * fp.row);
    out.push_back(std::move(g));
  }
  return out;
}

void FSDPModule::zero_grad() {
  for (Impl* s : subtree_states(*impl_->module)) {
    if (s->sharded_grad.defined()) s->sharded_grad.zero_();
    s->grads_kept = false;
    s->unsharded_grad = Tensor();
  }
}

std::vector<std::pair<std::string, dist::DTensor>> FSDPModule::sharded_parameters() {
  // In named_parameters() order, the order of PyTorch's state_dict.
  std::map<const nn::Parameter*, std::pair<Impl*, const FSDPParam*>> where;
  for (Impl* s : subtree_states(*impl_->module))
    for (auto& fp : s->params) where[fp.param] = {s, &fp};
  std::vector<std::pair<std::string, dist::DTensor>> out;
  const std::string prefix = impl_->module->path();
  for (auto& [rel, p] : impl_->module->named_parameters()) {
    auto it = where.find(p);
    FSDP_CHECK(it != where.end(), "[fully_shard] parameter '{}' is not sharded",
               join_name(prefix, rel));
    auto [s, fp] = it->second;
    Shape local_shape = p->shape;
    local_shape[0] = fp->local_rows;
    std::vector<dist::Placement> placements;
    if (s->mesh->ndim() == 2) placements.push_back(dist::Replicate{});
    placements.push_back(dist::Shard{0});
    out.emplace_back(fp->name, dist::DTensor::from_local(s->local_shard(*fp).view(local_shape),
                                                         s->mesh, placements, p->shape));
  }
  return out;
}

std::vector<FSDPModule::ShardInfo> FSDPModule::shard_infos() {
  std::map<const nn::Parameter*, std::pair<size_t, const FSDPParam*>> where;
  size_t group = 0;
  for (Impl* s : subtree_states(*impl_->module)) {
    if (s->params.empty()) continue;
    for (auto& fp : s->params) where[fp.param] = {group, &fp};
    ++group;
  }
  std::vector<ShardInfo> out;
  for (auto& [rel, p] : impl_->module->named_parameters()) {
    auto it = where.find(p);
    FSDP_CHECK(it != where.end(), "[fully_shard] parameter '{}' is not sharded", rel);
    auto [g, fp] = it->second;
    out.push_back({fp->name, p->shape, fp->local_begin, fp->local_rows, g, fp->shard_offset});
  }
  return out;
}

int FSDPModule::shard_rank() const { return impl_->rank; }
std::shared_ptr<dist::ProcessGroup> FSDPModule::shard_group() const {
  return impl_->mesh->group(impl_->mesh->ndim() - 1);
}

int FSDPModule::shard_count() const { return impl_->N; }
bool FSDPModule::first_replica() const {
  return impl_->mesh->ndim() == 1 || impl_->mesh->local_rank(0) == 0;
}

FSDPModule::CommStats FSDPModule::comm_stats() const {
  CommStats st;
  std::vector<const dist::ProcessGroup*> seen;
  for (Impl* s : subtree_states(*impl_->module))
    for (auto* g : {s->ag_group.get(), s->rs_group.get(), s->replicate_group.get()})
      if (g && std::find(seen.begin(), seen.end(), g) == seen.end()) {
        seen.push_back(g);
        st.comm_seconds += g->comm_seconds();
      }
  st.exposed_seconds = double(exposed_ns.load()) * 1e-9;
  return st;
}

int64_t FSDPModule::sharded_bytes() const {
  int64_t b = 0;
  for (Impl* s : subtree_states(*impl_->module))
    if (s->sharded.defined()) b += int64_t(s->sharded.nbytes() + s->sharded_grad.nbytes());
  return b;
}

// ---------------------------------------------------------------- hooks

Tensor FSDPModule::pre_forward(nn::Module&, const Tensor& x) {
  Impl& s = *impl_;
  if (!s.root) s.lazy_init_root();
  if (s.is_root) {
    // On CPU the optimizer step ran on this thread, so every all-gather
    // issued from here on reads the updated shards.
    s.prev_fwd_order = std::exchange(s.fwd_order, {});
    s.post_fwd_order.clear();
  }
  s.root->fwd_order.push_back(&s);
  s.unshard_issue();
  for (Impl* t : s.forward_prefetch_targets()) t->unshard_issue();
  s.unshard_wait();
  log_event("fwd_begin", s.label());
  if (s.opt.mp_policy.param_dtype && is_floating(x.dtype()) && x.dtype() != s.param_dtype)
    return x.to(s.param_dtype);
  return x;
}

Tensor FSDPModule::post_forward(nn::Module&, const Tensor& y) {
  Impl& s = *impl_;
  log_event("fwd_end", s.label());
  s.root->post_fwd_order.push_back(&s);
  if (!s.is_root && s.reshard_after_forward) s.do_reshard();
  if (s.opt.mp_policy.output_dtype && is_floating(y.dtype()))
    return y.to(*s.opt.mp_policy.output_dtype);
  return y;
}

void FSDPModule::pre_backward(nn::Module&) {
  Impl& s = *impl_;
  s.unshard_issue();
  for (Impl* t : s.backward_prefetch_targets()) t->unshard_issue();
  s.unshard_wait();
  s.prepare_grads();
  log_event("bwd_begin", s.label());
}

void FSDPModule::post_backward(nn::Module&) {
  Impl& s = *impl_;
  log_event("bwd_end", s.label());
  s.reduce_grads();
  if (s.reshard_after_backward) s.do_reshard();
  if (s.is_root) s.finish_backward();
}

// ---------------------------------------------------------------- fully_shard

FSDPModule* fsdp_state(const nn::Module& module) {
  return dynamic_cast<FSDPModule*>(module.hooks());
}

FSDPModule& fully_shard(nn::Module& module, std::shared_ptr<dist::DeviceMesh> mesh,
                        FullyShardOptions options) {
  FSDP_CHECK(mesh, "[fully_shard] no device mesh");
  const std::string where = module.path().empty()
                                ? module.type_name()
                                : fmt::format("{} '{}'", module.type_name(), module.path());
  FSDP_CHECK(!fsdp_state(module),
             "[fully_shard] {} is already sharded; apply fully_shard once per module", where);
  FSDP_CHECK(!module.hooks(), "[fully_shard] {} already has module hooks", where);
  FSDP_CHECK(mesh->ndim() == 1 || mesh->ndim() == 2,
             "[fully_shard] the mesh must be 1-D (shard) or 2-D (replicate, shard), got {}",
             mesh->str());

  auto impl = std::make_unique<FSDPModule::Impl>();
  impl->module = &module;
  impl->mesh = mesh;
  impl->opt = options;
  impl->reshard_after_forward = options.reshard_after_forward;
  const int shard_dim = mesh->ndim() - 1;
  impl->shard_group = mesh->group(shard_dim);
  if (mesh->ndim() == 2) impl->replicate_group = mesh->group(0);
  impl->N = impl->shard_group->size();
  impl->rank = impl->shard_group->rank();
  impl->collect(module, module.path(), true);
  impl->init_shards();
  if (!impl->params.empty() && !impl->direct) {
    // The CPU form of FSDP2's all-gather and reduce-scatter streams: two more
    // communicators shared by every group on this mesh, each with its own
    // thread, so a reduce-scatter in flight never delays the next all-gather.
    impl->ag_group = mesh->stream_group(shard_dim, 0);
    impl->rs_group = mesh->stream_group(shard_dim, 1);
    impl->ag_group->set_label("all-gather");
    impl->rs_group->set_label("reduce-scatter");
  }
  auto state = std::make_shared<FSDPModule>(std::move(impl));
  module.set_hooks(state);
  return *state;
}

}  // namespace fsdp
