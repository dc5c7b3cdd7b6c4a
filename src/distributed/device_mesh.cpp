// DeviceMesh construction: one split of the world per mesh dim.
#include "fsdp/distributed/device_mesh.h"

#include <algorithm>
#include <variant>

#include "fsdp/distributed/init.h"
#include "fsdp/distributed/placement.h"
#include "src/distributed/meta_group.h"

namespace fsdp::dist {

std::string placement_str(const Placement& p) {
  if (auto* s = std::get_if<Shard>(&p))
    return s->split_factor > 1
               ? fmt::format("_StridedShard({}, split_factor={})", s->dim, s->split_factor)
               : fmt::format("Shard({})", s->dim);
  if (std::holds_alternative<Replicate>(p)) return "Replicate()";
  return fmt::format("Partial({})", reduce_op_name(std::get<Partial>(p).op));
}

int64_t chunk_size(int64_t n, int64_t parts) { return (n + parts - 1) / parts; }

std::pair<int64_t, int64_t> chunk_range(int64_t n, int64_t parts, int64_t index) {
  const int64_t cs = chunk_size(n, parts);
  const int64_t begin = std::min(n, index * cs);
  return {begin, std::min(n, begin + cs) - begin};
}

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> group, std::vector<int64_t> shape,
                       std::vector<std::string> names)
    : whole_(std::move(group)), shape_(std::move(shape)), names_(std::move(names)) {
  FSDP_CHECK(whole_, "[DeviceMesh] no process group");
  FSDP_CHECK(ndim() == 1 || ndim() == 2, "[DeviceMesh] meshes have 1 or 2 dims, got {}", ndim());
  int64_t total = 1;
  for (int64_t s : shape_) {
    FSDP_CHECK(s >= 1, "[DeviceMesh] mesh shape {} has a dim < 1", shape_str(shape_));
    total *= s;
  }
  FSDP_CHECK(total == whole_->size(),
             "[DeviceMesh] mesh shape {} holds {} ranks but the group has {}", shape_str(shape_),
             total, whole_->size());
  if (names_.empty())
    for (int d = 0; d < ndim(); ++d) names_.push_back(fmt::format("dim{}", d));
  FSDP_CHECK(int(names_.size()) == ndim(), "[DeviceMesh] {} names for {} dims", names_.size(),
             ndim());
  FSDP_CHECK(ndim() == 1 || names_[0] != names_[1],
             "[DeviceMesh] dim names must differ, got '{}' twice", names_[0]);
  const int64_t r = whole_->rank();
  coord_ =
      ndim() == 1 ? std::vector<int64_t>{r} : std::vector<int64_t>{r / shape_[1], r % shape_[1]};
  if (ndim() == 1) {
    groups_.push_back(whole_);
  } else {
    // dim 0 groups: same column; dim 1 groups: same row.
    groups_.push_back(whole_->split(int(coord_[1]), int(coord_[0])));
    groups_.push_back(whole_->split(int(coord_[0]), int(coord_[1])));
  }
}

int64_t DeviceMesh::size(int dim) const {
  FSDP_CHECK(dim >= 0 && dim < ndim(), "[DeviceMesh] dim {} out of range for a {}-D mesh", dim,
             ndim());
  return shape_[size_t(dim)];
}

int64_t DeviceMesh::size() const { return whole_->size(); }

int DeviceMesh::dim_index(const std::string& name) const {
  for (int d = 0; d < ndim(); ++d)
    if (names_[size_t(d)] == name) return d;
  FSDP_FAIL("[DeviceMesh] no dim named '{}' in mesh {}", name, str());
}

std::shared_ptr<ProcessGroup> DeviceMesh::group(int dim) const {
  FSDP_CHECK(dim >= 0 && dim < ndim(), "[DeviceMesh] dim {} out of range for a {}-D mesh", dim,
             ndim());
  return groups_[size_t(dim)];
}

std::shared_ptr<ProcessGroup> DeviceMesh::stream_group(int dim, int index) const {
  auto& g = stream_groups_[{dim, index}];
  if (!g) {
    g = group(dim)->split(0, group(dim)->rank());
    g->set_label(fmt::format("{} stream {}", names_[size_t(dim)], index));
  }
  return g;
}

std::shared_ptr<DeviceMesh> DeviceMesh::operator[](const std::string& name) const {
  const int d = dim_index(name);
  std::shared_ptr<DeviceMesh> sub(new DeviceMesh());
  sub->whole_ = groups_[size_t(d)];
  sub->shape_ = {shape_[size_t(d)]};
  sub->coord_ = {coord_[size_t(d)]};
  sub->names_ = {name};
  sub->groups_ = {groups_[size_t(d)]};
  return sub;
}

std::string DeviceMesh::str() const {
  std::vector<std::string> parts;
  for (int d = 0; d < ndim(); ++d)
    parts.push_back(fmt::format("{}={}", names_[size_t(d)], shape_[size_t(d)]));
  return fmt::format("DeviceMesh({}, {})", fmt::join(parts, ", "), whole_->backend());
}

std::shared_ptr<DeviceMesh> init_device_mesh(std::vector<int64_t> shape,
                                             std::vector<std::string> names) {
  return std::make_shared<DeviceMesh>(world(), std::move(shape), std::move(names));
}

std::shared_ptr<DeviceMesh> make_expert_mesh(std::shared_ptr<ProcessGroup> group, int64_t ep) {
  FSDP_CHECK(group, "[expert mesh] no process group");
  const int64_t n = group->size();
  FSDP_CHECK(ep >= 1 && n % ep == 0,
             "[expert mesh] expert parallel degree {} must be >= 1 and divide the group's {} "
             "ranks (ep ranks exchange tokens; size / ep ranks hold the same experts)",
             ep, n);
  // A meta group (the memory plan's) splits into the sizes of the mesh it was made for, which is
  // the run's main mesh: the expert mesh gets a meta group of its own shape, at the same rank, or
  // its two groups would be the whole world (the experts planned at 1 / (ep x world) of their
  // bytes).
  if (group->device().is_meta())
    group = std::make_shared<MetaGroup>(int(n), group->rank(), std::vector<int64_t>{n / ep, ep});
  return std::make_shared<DeviceMesh>(std::move(group), std::vector<int64_t>{n / ep, ep},
                                      std::vector<std::string>{"dp_shard_mod_ep", "ep"});
}

std::shared_ptr<DeviceMesh> init_expert_mesh(int64_t ep) { return make_expert_mesh(world(), ep); }

}  // namespace fsdp::dist
