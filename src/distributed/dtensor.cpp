// DTensor placement changes, one mesh dim at a time. Sharded dims are moved
// to the front, padded to the chunk size and sent as one flat buffer, since
// the collectives work on dim 0 of contiguous tensors.
#include "fsdp/distributed/dtensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace fsdp::dist {

namespace {

void check_placements(const char* op, const DeviceMesh& mesh, const std::vector<Placement>& p,
                      int tensor_dim) {
  FSDP_CHECK(int(p.size()) == mesh.ndim(), "[{}] {} placements for a {}-D mesh", op, p.size(),
             mesh.ndim());
  for (const Placement& pl : p)
    if (auto* s = std::get_if<Shard>(&pl))
      FSDP_CHECK(s->dim >= 0 && s->dim < tensor_dim, "[{}] {} is out of range for a {}-D tensor",
                 op, placement_str(pl), tensor_dim);
}

// Extent of tensor dim d seen by mesh dim i: the global extent chunked by the
// mesh dims before i that shard d.
int64_t parent_extent(const Shape& global, const DeviceMesh& mesh, const std::vector<Placement>& p,
                      int i, int d, const std::vector<int64_t>& coord) {
  int64_t n = global[size_t(d)];
  for (int j = 0; j < i; ++j)
    if (is_shard(p[size_t(j)], d)) n = chunk_range(n, mesh.size(j), coord[size_t(j)]).second;
  return n;
}

// Moves dim d to the front and returns a contiguous [rows, rest...] copy padded to `rows`.
Tensor front_padded(const Tensor& t, int d, int64_t rows) {
  Tensor f = t.transpose(0, d).contiguous();
  if (f.size(0) == rows) return f;
  Shape s = f.shape();
  s[0] = rows;
  Tensor out = Tensor::zeros(s, t.dtype(), t.device());
  if (f.size(0) > 0) out.slice(0, f.size(0)).copy_(f);
  return out;
}

Tensor from_front(const Tensor& f, int d) { return f.transpose(0, d).contiguous(); }

// Shard(d) -> Replicate along mesh dim i.
Tensor all_gather_dim(const Tensor& local, const DeviceMesh& mesh, int i, int d, int64_t parent) {
  auto g = mesh.group(i);
  const int64_t n = g->size(), cs = chunk_size(parent, n);
  Tensor in = front_padded(local, d, cs);
  Shape os = in.shape();
  os[0] = cs * n;
  Tensor out = Tensor::empty(os, local.dtype(), local.device());
  g->all_gather_into_tensor(out, in)->wait();
  Shape rs = in.shape();
  rs[0] = parent;
  Tensor res = Tensor::empty(rs, local.dtype(), local.device());
  for (int64_t k = 0; k < n; ++k) {
    auto [b, len] = chunk_range(parent, n, k);
    if (len > 0) res.slice(b, b + len).copy_(out.slice(k * cs, k * cs + len));
  }
  return from_front(res, d);
}

// Partial -> Shard(d) along mesh dim i, as a reduce-scatter.
Tensor reduce_scatter_dim(const Tensor& local, const DeviceMesh& mesh, int i, int d, ReduceOp op) {
  auto g = mesh.group(i);
  const int64_t n = g->size(), extent = local.size(d), cs = chunk_size(extent, n);
  Tensor f = local.transpose(0, d).contiguous();
  Shape is = f.shape();
  is[0] = cs * n;
  Tensor in = Tensor::zeros(is, local.dtype(), local.device());
  for (int64_t k = 0; k < n; ++k) {
    auto [b, len] = chunk_range(extent, n, k);
    if (len > 0) in.slice(k * cs, k * cs + len).copy_(f.slice(b, b + len));
  }
  Shape os = is;
  os[0] = cs;
  Tensor out = Tensor::empty(os, local.dtype(), local.device());
  g->reduce_scatter_tensor(out, in, op)->wait();
  auto [b, len] = chunk_range(extent, n, mesh.local_rank(i));
  return from_front(out.slice(0, len), d);
}

}  // namespace

Shape DTensor::local_shape(const Shape& global, const DeviceMesh& mesh,
                           const std::vector<Placement>& p, const std::vector<int64_t>& coord) {
  Shape s = global;
  // The plain shards in mesh-dim order, then the strided ones, which chunk what those left.
  for (bool strided : {false, true})
    for (int i = 0; i < mesh.ndim(); ++i)
      if (auto* sh = std::get_if<Shard>(&p[size_t(i)]); sh && (sh->split_factor > 1) == strided)
        s[size_t(sh->dim)] = chunk_range(s[size_t(sh->dim)], mesh.size(i), coord[size_t(i)]).second;
  return s;
}

DTensor DTensor::from_local(const Tensor& local, std::shared_ptr<DeviceMesh> mesh,
                            std::vector<Placement> placements, std::optional<Shape> global_shape) {
  FSDP_CHECK(mesh, "[DTensor::from_local] no mesh");
  check_placements("DTensor::from_local", *mesh, placements, local.dim());
  DTensor t;
  t.local_ = local;
  t.mesh_ = std::move(mesh);
  t.placements_ = std::move(placements);
  if (global_shape) {
    t.shape_ = *global_shape;
    FSDP_CHECK(int(t.shape_.size()) == local.dim(),
               "[DTensor::from_local] global shape {} for a local {}", shape_str(t.shape_),
               shape_str(local.shape()));
  } else {
    t.shape_ = local.shape();
    for (int i = 0; i < t.mesh_->ndim(); ++i)
      if (auto* sh = std::get_if<Shard>(&t.placements_[size_t(i)]))
        t.shape_[size_t(sh->dim)] *= t.mesh_->size(i);
  }
  const Shape expect = local_shape(t.shape_, *t.mesh_, t.placements_, t.mesh_->coordinate());
  FSDP_CHECK(expect == local.shape(),
             "[DTensor::from_local] local shape {} does not match {} of global {} on this rank "
             "(expected {})",
             shape_str(local.shape()), "the placements", shape_str(t.shape_), shape_str(expect));
  return t;
}

DTensor DTensor::distribute_tensor(const Tensor& full, std::shared_ptr<DeviceMesh> mesh,
                                   std::vector<Placement> placements, int src_rank) {
  FSDP_CHECK(mesh, "[distribute_tensor] no mesh");
  FSDP_CHECK(src_rank >= 0 && src_rank < mesh->size(),
             "[distribute_tensor] src_rank {} is not a rank of {}", src_rank, mesh->str());
  check_placements("distribute_tensor", *mesh, placements, full.dim());
  Tensor buf = full.contiguous().clone();
  mesh->whole()->broadcast(buf, src_rank)->wait();
  DTensor rep;
  rep.local_ = buf;
  rep.mesh_ = std::move(mesh);
  rep.shape_ = full.shape();
  rep.placements_.assign(size_t(rep.mesh_->ndim()), Replicate{});
  return rep.redistribute(placements);
}

Tensor DTensor::full_tensor() const {
  // Strided shards first: they chunked last, so they are gathered first, each over the extent
  // the plain shards left; what remains is plain.
  DTensor plain = *this;
  for (int i = 0; i < mesh_->ndim(); ++i)
    if (auto* sh = std::get_if<Shard>(&placements_[size_t(i)]); sh && sh->split_factor > 1) {
      Shape left = shape_;
      for (int j = 0; j < mesh_->ndim(); ++j)
        if (auto* o = std::get_if<Shard>(&plain.placements_[size_t(j)]);
            o && o->split_factor == 1 && o->dim == sh->dim)
          left[size_t(sh->dim)] =
              chunk_range(left[size_t(sh->dim)], mesh_->size(j), mesh_->local_rank(j)).second;
      plain.local_ = all_gather_dim(plain.local_, *mesh_, i, sh->dim, left[size_t(sh->dim)]);
      plain.placements_[size_t(i)] = Replicate{};
    }
  return plain.redistribute(std::vector<Placement>(size_t(mesh_->ndim()), Replicate{})).to_local();
}

DTensor DTensor::redistribute(const std::vector<Placement>& target) const {
  const DeviceMesh& mesh = *mesh_;
  check_placements("DTensor::redistribute", mesh, target, int(shape_.size()));
  for (const auto* list : {&placements_, &target})
    for (const Placement& pl : *list)
      FSDP_CHECK(!is_shard(pl) || std::get<Shard>(pl).split_factor == 1,
                 "[DTensor::redistribute] {} is gathered whole only (full_tensor()); "
                 "redistribute takes Shard, Replicate and Partial",
                 placement_str(pl));
  const auto& coord = mesh.coordinate();
  std::vector<Placement> cur = placements_;
  Tensor local = local_;
  const int nd = mesh.ndim();

  auto shards_elsewhere = [&](int i, int d) {
    for (int j = 0; j < nd; ++j)
      if (j != i && (is_shard(cur[size_t(j)], d) || is_shard(target[size_t(j)], d))) return true;
    return false;
  };

  // 1. Last mesh dim to first: undo shards that change (and the later shards
  //    of the same tensor dim nested inside a change), reduce partials.
  for (int i = nd - 1; i >= 0; --i) {
    const Placement& from = cur[size_t(i)];
    const Placement& to = target[size_t(i)];
    if (auto* sh = std::get_if<Shard>(&from)) {
      bool nested_change = false;
      for (int j = 0; j < i; ++j)
        if (!(cur[size_t(j)] == target[size_t(j)]) &&
            (is_shard(cur[size_t(j)], sh->dim) || is_shard(target[size_t(j)], sh->dim)))
          nested_change = true;
      if (!(from == to) || nested_change) {
        const int64_t parent = parent_extent(shape_, mesh, cur, i, sh->dim, coord);
        local = all_gather_dim(local, mesh, i, sh->dim, parent);
        cur[size_t(i)] = Replicate{};
      }
    } else if (auto* pa = std::get_if<Partial>(&from)) {
      if (from == to) continue;
      if (auto* tsh = std::get_if<Shard>(&to); tsh && !shards_elsewhere(i, tsh->dim)) {
        local = reduce_scatter_dim(local, mesh, i, tsh->dim, pa->op);
        cur[size_t(i)] = *tsh;
        continue;
      }
      FSDP_CHECK(!std::holds_alternative<Partial>(to),
                 "[DTensor::redistribute] {} -> {} is not supported", placement_str(from),
                 placement_str(to));
      Tensor t = local.contiguous().clone();
      mesh.group(i)->all_reduce(t, pa->op)->wait();
      local = t;
      cur[size_t(i)] = Replicate{};
    }
  }
  // 2. First mesh dim to last: chunk into new shards, make new partials.
  for (int i = 0; i < nd; ++i) {
    const Placement& to = target[size_t(i)];
    if (cur[size_t(i)] == to) continue;
    FSDP_CHECK(std::holds_alternative<Replicate>(cur[size_t(i)]),
               "[DTensor::redistribute] internal: mesh dim {} is {} on the way to {}", i,
               placement_str(cur[size_t(i)]), placement_str(to));
    if (auto* sh = std::get_if<Shard>(&to)) {
      auto [b, len] = chunk_range(local.size(sh->dim), mesh.size(i), coord[size_t(i)]);
      local = local.narrow(sh->dim, b, len).contiguous();
    } else if (auto* pa = std::get_if<Partial>(&to)) {
      // SUM: one rank of the mesh dim keeps the value, the others hold zeros.
      if (pa->op == ReduceOp::SUM && coord[size_t(i)] != 0)
        local = Tensor::zeros(local.shape(), local.dtype(), local.device());
    }
    cur[size_t(i)] = to;
  }
  DTensor out;
  out.local_ = local;
  out.mesh_ = mesh_;
  out.placements_ = target;
  out.shape_ = shape_;
  return out;
}

// ---------------------------------------------------------------- parameters

std::string ParameterPlacement::str() const {
  std::vector<std::string> p;
  for (const Placement& pl : placements) p.push_back(placement_str(pl));
  return fmt::format("[{}] on {}", fmt::join(p, ", "), mesh ? mesh->str() : "no mesh");
}

std::pair<int64_t, int64_t> ParameterPlacement::local_range(int dim) const {
  int64_t begin = 0, n = global_shape.at(size_t(dim));
  for (bool strided : {false, true})  // as DTensor::local_shape
    for (int i = 0; i < mesh->ndim(); ++i)
      if (auto* sh = std::get_if<Shard>(&placements[size_t(i)]);
          sh && sh->dim == dim && (sh->split_factor > 1) == strided) {
        auto [b, len] = chunk_range(n, mesh->size(i), mesh->local_rank(i));
        begin += b;
        n = len;
      }
  return {begin, n};
}

namespace {
std::shared_ptr<ParameterPlacement> make_placement(const char* op, const nn::Parameter& p,
                                                   const std::string& name,
                                                   std::shared_ptr<DeviceMesh> mesh,
                                                   std::vector<Placement> placements,
                                                   Shape global_shape) {
  const std::string who = name.empty() ? p.local_name : name;
  FSDP_CHECK(mesh, "[{}] parameter '{}': no mesh", op, who);
  FSDP_CHECK(!p.placement, "[{}] parameter '{}' is already placed ({}); place a parameter once", op,
             who, p.placement->str());
  FSDP_CHECK(int(placements.size()) == mesh->ndim(),
             "[{}] parameter '{}': {} placements for the {}-D {}; expected one per mesh dim", op,
             who, placements.size(), mesh->ndim(), mesh->str());
  for (const Placement& pl : placements) {
    FSDP_CHECK(!std::holds_alternative<Partial>(pl),
               "[{}] parameter '{}': {} is not a parameter's placement (a parameter holds values, "
               "not partial sums); expected Shard(d) or Replicate()",
               op, who, placement_str(pl));
    if (auto* sh = std::get_if<Shard>(&pl)) {
      FSDP_CHECK(sh->dim >= 0 && sh->dim < int(global_shape.size()),
                 "[{}] parameter '{}': {} is out of range for its {}-D shape {}", op, who,
                 placement_str(pl), global_shape.size(), shape_str(global_shape));
      FSDP_CHECK(sh->split_factor == 1,
                 "[{}] parameter '{}': {} is what fully_shard composes, not a placement to give "
                 "a parameter; expected Shard(d) or Replicate()",
                 op, who, placement_str(pl));
    }
  }
  auto out = std::make_shared<ParameterPlacement>();
  out->global_shape = std::move(global_shape);
  out->mesh = std::move(mesh);
  out->placements = std::move(placements);
  return out;
}
}  // namespace

void distribute_parameter(nn::Parameter& p, std::shared_ptr<DeviceMesh> mesh,
                          std::vector<Placement> placements, const std::string& name) {
  auto pl = make_placement("distribute_parameter", p, name, std::move(mesh), std::move(placements),
                           p.shape);
  Shape local = p.shape;
  for (int d = 0; d < int(local.size()); ++d) {
    auto [b, len] = pl->local_range(d);
    local[size_t(d)] = len;
    if (p.data.defined() && len != p.data.size(d)) p.data = p.data.narrow(d, b, len);
    if (p.grad.defined() && len != p.grad.size(d)) p.grad = p.grad.narrow(d, b, len);
  }
  // A copy of its own: the piece no longer shares the whole tensor's storage (a flat buffer).
  if (p.data.defined()) p.data = p.data.contiguous().clone();
  if (p.grad.defined()) p.grad = p.grad.contiguous().clone();
  p.shape = std::move(local);
  p.placement = std::move(pl);
}

void from_local_parameter(nn::Parameter& p, std::shared_ptr<DeviceMesh> mesh,
                          std::vector<Placement> placements, Shape global_shape,
                          const std::string& name) {
  FSDP_CHECK(global_shape.size() == p.shape.size(),
             "[from_local_parameter] parameter '{}' has shape {} but its global shape is {}; "
             "expected as many dims",
             name.empty() ? p.local_name : name, shape_str(p.shape), shape_str(global_shape));
  auto pl = make_placement("from_local_parameter", p, name, std::move(mesh), std::move(placements),
                           std::move(global_shape));
  const Shape want =
      DTensor::local_shape(pl->global_shape, *pl->mesh, pl->placements, pl->mesh->coordinate());
  FSDP_CHECK(want == p.shape,
             "[from_local_parameter] parameter '{}' has shape {} but this rank's piece of {} {} "
             "is {}",
             name.empty() ? p.local_name : name, shape_str(p.shape), shape_str(pl->global_shape),
             pl->str(), shape_str(want));
  p.placement = std::move(pl);
}

}  // namespace fsdp::dist
