// fully_shard and the FSDPModule methods. The runtime lives in FSDP2's
// pieces: FSDPParam (src/fsdp/fsdp_param.h, one parameter's layout),
// FSDPParamGroup (fsdp_param_group.h, the flat buffers and their collectives)
// and FSDPState (fsdp_state.h, the hooks, and the root's context).
#include "fsdp/fsdp/fully_shard.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <variant>

#include "fsdp/distributed/placement.h"
#include "fsdp/fsdp/replicate.h"
#include "src/fsdp/fsdp_state.h"

namespace fsdp {

namespace {

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// The parameters of `m`'s subtree that no inner fully_shard owns, with full names.
void collect(nn::Module& m, const std::string& prefix, bool top, std::vector<FSDPParam>& out) {
  if (!top && fsdp_state(m)) return;
  for (auto& [name, p] : m.direct_parameters()) {
    FSDPParam fp;
    fp.name = join_name(prefix, name);
    fp.param = p;
    out.push_back(std::move(fp));
  }
  for (auto& [cname, child] : m.named_children())
    collect(*child, join_name(prefix, cname), false, out);
}

// Reads a parameter's placement (nn::Parameter::placement): fully_shard shards, over `mesh`'s one
// dim, the rows the placement's other dims leave this rank; see fully_shard() in the header for
// what composes.
void read_placement(FSDPParam& fp, const dist::DeviceMesh& mesh) {
  const nn::Parameter& p = *fp.param;
  fp.global_shape = p.shape;
  if (!p.placement) return;
  auto pl = std::dynamic_pointer_cast<const dist::ParameterPlacement>(p.placement);
  FSDP_CHECK(pl && pl->mesh,
             "[fully_shard] parameter '{}' carries a placement that is not a dist::"
             "ParameterPlacement ({}); place it with dist::distribute_parameter",
             fp.name, p.placement->str());
  FSDP_CHECK(mesh.ndim() == 1,
             "[fully_shard] parameter '{}' is placed {}; fully_shard composes with a placement "
             "over a 1-D mesh (one dim of the parameter's), not the {}-D {} (HSDP)",
             fp.name, pl->str(), mesh.ndim(), mesh.str());
  int fsdp_dim = -1;
  for (int i = 0; i < pl->mesh->ndim(); ++i) {
    const dist::Placement& d = pl->placements[size_t(i)];
    const std::string dim_name = pl->mesh->names()[size_t(i)];
    FSDP_CHECK((dist::is_shard(d, 0) && std::get<dist::Shard>(d).split_factor == 1) ||
                   std::holds_alternative<dist::Replicate>(d),
               "[fully_shard] parameter '{}' is {} on mesh dim '{}' of {}; fully_shard composes "
               "only with Shard(0) (rows split by tensor or expert parallel) and Replicate()",
               fp.name, dist::placement_str(d), dim_name, pl->str());
    if (pl->mesh->group(i).get() == mesh.group(0).get()) {
      FSDP_CHECK(std::holds_alternative<dist::Replicate>(d),
                 "[fully_shard] parameter '{}' is {} on mesh dim '{}' of {}, the dim fully_shard "
                 "shards over; expected Replicate() there",
                 fp.name, dist::placement_str(d), dim_name, pl->str());
      fsdp_dim = i;
    }
  }
  FSDP_CHECK(fsdp_dim >= 0,
             "[fully_shard] parameter '{}' is placed {} but fully_shard's {} is none of its mesh's "
             "dims; pass the parameter mesh's data-parallel dim (mesh[\"dp\"])",
             fp.name, pl->str(), mesh.str());
  FSDP_CHECK(pl->global_shape.size() == p.shape.size(),
             "[fully_shard] parameter '{}' has shape {} but its placement's global shape is {}",
             fp.name, shape_str(p.shape), shape_str(pl->global_shape));
  fp.global_shape = pl->global_shape;
  fp.global_offset = pl->local_range(0).first;
  fp.placement = pl;
  fp.fsdp_dim = fsdp_dim;
}

// A placed parameter's placements with fully_shard's: Shard(0) on its dim, strided over the
// pieces the other dims' Shard(0) made (FSDP2's _StridedShard after tensor parallel).
std::vector<dist::Placement> composed(const FSDPParam& fp) {
  std::vector<dist::Placement> out = fp.placement->placements;
  int64_t pieces = 1;
  for (int i = 0; i < fp.placement->mesh->ndim(); ++i)
    if (dist::is_shard(out[size_t(i)], 0)) pieces *= fp.placement->mesh->size(i);
  out[size_t(fp.fsdp_dim)] = dist::Shard{.dim = 0, .split_factor = pieces};
  return out;
}

std::vector<FSDPState*> subtree_states(nn::Module& m) {
  std::vector<FSDPState*> out;
  m.for_each_module([&](nn::Module& x) {
    if (FSDPModule* s = fsdp_state(x)) out.push_back(&s->state());
  });
  return out;
}

}  // namespace

// ---------------------------------------------------------------- PackedRows

int64_t PackedRows::rows() const {
  int64_t n = 0;
  for (const Run& r : runs) n += r.rows;
  return n;
}

int64_t PackedRows::bytes(int64_t row_begin, int64_t row_end) const {
  int64_t out = 0, at = 0;
  for (const Run& r : runs) {
    const int64_t a = std::max(row_begin, at), b = std::min(row_end, at + r.rows);
    if (a < b) out += (b - a) * r.row_bytes;
    at += r.rows;
  }
  return out;
}

int64_t PackedRows::padded_chunk_bytes(int n) const {
  int64_t most = 0;
  for (int k = 0; k < n; ++k) {
    auto [b, len] = dist::chunk_range(rows(), n, k);
    most = std::max(most, bytes(b, b + len));
  }
  return (most + 15) / 16 * 16;
}

// ---------------------------------------------------------------- FSDPModule

FSDPModule::FSDPModule(std::unique_ptr<FSDPState> state)
    : DataParallelModule(*state->module), impl_(std::move(state)) {}
FSDPModule::~FSDPModule() = default;

std::shared_ptr<UnshardHandle> FSDPModule::unshard(bool async) {
  impl_->unshard_issue(impl_->comm());
  if (!async) impl_->unshard_wait(impl_->comm());
  FSDPState* s = impl_.get();
  return std::make_shared<UnshardHandle>([s] { s->unshard_wait(s->comm()); });
}

void FSDPModule::reshard() { impl_->reshard(impl_->comm()); }

void FSDPModule::set_requires_gradient_sync(bool sync) {
  for (FSDPState* s : subtree_states(*impl_->module))
    for (FSDPParamGroup& g : s->groups) g.set_requires_sync(sync);
}
void FSDPModule::set_reshard_after_backward(bool reshard) {
  impl_->reshard_after_backward = reshard;
}
void FSDPModule::set_reshard_after_forward(bool reshard) { impl_->reshard_after_forward = reshard; }

void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule*>& modules) {
  impl_->explicit_fwd = true;
  impl_->fwd_prefetch.clear();
  for (FSDPModule* m : modules) impl_->fwd_prefetch.push_back(&m->state());
}

void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule*>& modules) {
  impl_->explicit_bwd = true;
  impl_->bwd_prefetch.clear();
  for (FSDPModule* m : modules) impl_->bwd_prefetch.push_back(&m->state());
}

std::vector<nn::ParamGroup> FSDPModule::param_groups(double weight_decay, bool decay_1d) {
  std::vector<nn::ParamGroup> out;
  for (FSDPState* s : subtree_states(*impl_->module))
    for (FSDPParamGroup& group : s->groups) {
      if (group.empty()) continue;
      nn::ParamGroup g{group.sharded(), group.sharded_grad(), weight_decay};
      FSDPParamGroup* settled = &group;  // the module's groups are fixed at its construction
      g.settle_grads = [settled] { settled->settle_grad(); };
      if (!decay_1d)
        for (auto& fp : group.params())
          if (fp.param->shape.size() == 1)
            g.no_decay.emplace_back(fp.shard_offset, fp.padded_rows * fp.row);
      out.push_back(std::move(g));
    }
  return out;
}

void FSDPModule::zero_grad() {
  for (FSDPState* s : subtree_states(*impl_->module))
    for (FSDPParamGroup& g : s->groups) g.zero_grad();
}

std::vector<std::pair<std::string, dist::DTensor>> FSDPModule::sharded_parameters() {
  // In named_parameters() order, the order of PyTorch's state_dict.
  std::map<const nn::Parameter*, std::tuple<FSDPState*, const FSDPParamGroup*, const FSDPParam*>>
      where;
  for (FSDPState* s : subtree_states(*impl_->module))
    for (const FSDPParamGroup& g : s->groups)
      for (auto& fp : g.params()) where[fp.param] = {s, &g, &fp};
  std::vector<std::pair<std::string, dist::DTensor>> out;
  const std::string prefix = impl_->module->path();
  for (auto& [rel, p] : impl_->module->named_parameters()) {
    auto it = where.find(p);
    FSDP_CHECK(it != where.end(), "[fully_shard] parameter '{}' is not sharded",
               join_name(prefix, rel));
    auto [s, g, fp] = it->second;
    if (fp->packed) continue;  // its shard is bytes: no float values to show
    Shape local_shape = p->shape;
    local_shape[0] = fp->local_rows;
    const Tensor local = g->local_shard(*fp).view(local_shape);
    if (fp->placement) {  // on the parameter's mesh, at its global shape
      out.emplace_back(fp->name, dist::DTensor::from_local(local, fp->placement->mesh,
                                                           composed(*fp), fp->global_shape));
      continue;
    }
    std::vector<dist::Placement> placements;
    if (s->mesh->ndim() == 2) placements.push_back(dist::Replicate{});
    placements.push_back(dist::Shard{0});
    out.emplace_back(fp->name, dist::DTensor::from_local(local, s->mesh, placements, p->shape));
  }
  return out;
}

std::vector<FSDPModule::ShardInfo> FSDPModule::shard_infos() {
  struct Where {
    size_t group;
    const FSDPParam* fp;
    const FSDPState* state;
  };
  std::map<const nn::Parameter*, Where> where;
  size_t group = 0;
  for (FSDPState* s : subtree_states(*impl_->module))
    for (const FSDPParamGroup& g : s->groups) {
      if (g.empty()) continue;
      for (auto& fp : g.params()) where[fp.param] = {group, &fp, s};
      ++group;
    }
  std::vector<ShardInfo> out;
  for (auto& [rel, p] : impl_->module->named_parameters()) {
    auto it = where.find(p);
    FSDP_CHECK(it != where.end(), "[fully_shard] parameter '{}' is not sharded", rel);
    const auto& [g, fp, s] = it->second;
    ShardInfo in;
    in.name = fp->name;
    in.global_shape = fp->global_shape;
    in.local_begin = fp->global_offset + fp->local_begin;
    in.local_rows = fp->local_rows;
    in.group = g;
    in.offset = fp->shard_offset;
    in.packed = fp->packed.has_value();
    in.packed_bytes = fp->local_bytes;
    if (fp->placement) {
      in.mesh = fp->placement->mesh;
      in.placements = composed(*fp);
      in.fsdp_dim = fp->fsdp_dim;
    } else {
      in.mesh = s->mesh;
      if (s->mesh->ndim() == 2) in.placements.push_back(dist::Replicate{});
      in.placements.push_back(dist::Shard{0});
      in.fsdp_dim = s->mesh->ndim() - 1;
    }
    out.push_back(std::move(in));
  }
  return out;
}

int FSDPModule::shard_rank() const { return shard_group()->rank(); }
const std::shared_ptr<dist::DeviceMesh>& FSDPModule::mesh() const { return impl_->mesh; }
std::shared_ptr<dist::ProcessGroup> FSDPModule::shard_group() const {
  return impl_->mesh->group(impl_->mesh->ndim() - 1);
}

int FSDPModule::shard_count() const { return impl_->trainable().shard_count(); }
bool FSDPModule::first_replica() const {
  return impl_->mesh->ndim() == 1 || impl_->mesh->local_rank(0) == 0;
}

FSDPModule::CommStats FSDPModule::comm_stats() const {
  CommStats st;
  std::vector<const dist::ProcessGroup*> seen;
  for (FSDPState* s : subtree_states(*impl_->module))
    for (const FSDPParamGroup& group : s->groups) {
      st.all_gather_bytes += group.gathered_bytes();
      for (const dist::ProcessGroup* g : group.comm_groups())
        if (g && std::find(seen.begin(), seen.end(), g) == seen.end()) {
          seen.push_back(g);
          st.comm_seconds += g->comm_seconds();
        }
    }
  const FSDPState* root = impl_->root ? impl_->root : impl_.get();
  if (root->root_ctx) st.exposed_seconds = root->root_ctx->comm.exposed_seconds();
  return st;
}

int64_t FSDPModule::sharded_bytes() const {
  int64_t b = 0;
  for (FSDPState* s : subtree_states(*impl_->module))
    for (const FSDPParamGroup& g : s->groups) {
      if (g.sharded().defined()) b += int64_t(g.sharded().nbytes());
      if (g.sharded_grad().defined()) b += int64_t(g.sharded_grad().nbytes());
    }
  return b;
}

// ---------------------------------------------------------------- hooks

Tensor FSDPModule::pre_forward(nn::Module&, const Tensor& x) { return impl_->pre_forward(x); }
Tensor FSDPModule::post_forward(nn::Module&, const Tensor& y) { return impl_->post_forward(y); }
Tensor FSDPModule::pre_backward(nn::Module&, const Tensor& dy) {
  impl_->pre_backward();
  return dy;
}
Tensor FSDPModule::post_backward(nn::Module&, const Tensor& dx) {
  impl_->post_backward();
  return dx;
}

void FSDPModule::set_event_log(bool on) { impl_->comm().set_log(on); }
std::vector<std::string> FSDPModule::take_event_log() { return impl_->comm().take_log(); }

// ---------------------------------------------------------------- fully_shard

FSDPModule* fsdp_state(const nn::Module& module) { return module.find_hooks<FSDPModule>(); }

FSDPModule& fully_shard(nn::Module& module, std::shared_ptr<dist::DeviceMesh> mesh,
                        FullyShardOptions options) {
  FSDP_CHECK(mesh, "[fully_shard] no device mesh");
  const std::string where = module.describe();
  FSDP_CHECK(!fsdp_state(module),
             "[fully_shard] {} is already sharded; apply fully_shard once per module", where);
  // Other hooks (a user's) may sit in the module's chain; another data-parallel wrapper may not.
  FSDP_CHECK(!module.find_hooks<ReplicateModule>(),
             "[fully_shard] {} is replicated by replicate(): a module is either replicated or "
             "sharded",
             where);
  for (const nn::Module* a = module.parent(); a; a = a->parent())
    FSDP_CHECK(!a->find_hooks<ReplicateModule>(),
               "[fully_shard] {} is inside {}, which replicate() replicates: a module is either "
               "replicated or sharded",
               where, a->describe());
  module.for_each_module([&](nn::Module& m) {
    FSDP_CHECK(!m.find_hooks<ReplicateModule>(),
               "[fully_shard] {} holds '{}', which replicate() replicates: a module is either "
               "replicated or sharded",
               where, m.path());
  });
  FSDP_CHECK(mesh->ndim() == 1 || mesh->ndim() == 2,
             "[fully_shard] the mesh must be 1-D (shard) or 2-D (replicate, shard), got {}",
             mesh->str());
  FSDP_CHECK(options.gradient_divide_factor >= 0,
             "[fully_shard] {}: gradient_divide_factor {} is negative", where,
             options.gradient_divide_factor);

  std::vector<FSDPParam> params;
  collect(module, module.path(), true, params);
  for (FSDPParam& fp : params) read_placement(fp, *mesh);
  auto state = std::make_shared<FSDPModule>(
      std::make_unique<FSDPState>(module, std::move(mesh), options, std::move(params)));
  module.add_hooks(state);  // never removed: the state lives as long as the module
  return *state;
}

}  // namespace fsdp
