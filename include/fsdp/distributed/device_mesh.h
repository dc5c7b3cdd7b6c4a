// DeviceMesh: the ranks of the world laid out row-major in 1 or 2 named
// dims, e.g. {2, 2} with names {"replicate", "shard"} for HSDP. Each mesh
// dim has a process group of the ranks that differ only in that coordinate
// (made with ProcessGroup::split, collectively, at construction). A named
// sub-mesh, mesh["shard"], is the 1-D mesh of that dim's group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/distributed/process_group.h"

namespace fsdp::dist {

class DeviceMesh {
 public:
  // Collective over `group`: every rank must call it with the same shape.
  DeviceMesh(std::shared_ptr<ProcessGroup> group, std::vector<int64_t> shape,
             std::vector<std::string> names = {});

  int ndim() const { return int(shape_.size()); }
  int64_t size(int dim) const;
  int64_t size() const;  // all ranks of the mesh
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& names() const { return names_; }
  int dim_index(const std::string& name) const;
  // This rank's coordinate along each dim.
  const std::vector<int64_t>& coordinate() const { return coord_; }
  int64_t local_rank(int dim) const { return coord_.at(size_t(dim)); }
  std::shared_ptr<ProcessGroup> group(int dim) const;
  std::shared_ptr<ProcessGroup> group(const std::string& name) const {
    return group(dim_index(name));
  }
  // The group of all ranks of the mesh.
  std::shared_ptr<ProcessGroup> whole() const { return whole_; }
  Device device() const { return whole_->device(); }
  // A duplicate of group(dim) with its own communication thread (CPU) or
  // stream (NCCL): the CPU form of a side CUDA stream. `index` names it (FSDP
  // uses 0 for all-gathers, 1 for reduce-scatters). Made collectively on first
  // use, which every rank reaches in the same order; later calls share it.
  std::shared_ptr<ProcessGroup> stream_group(int dim, int index) const;
  // The 1-D mesh along one named dim.
  std::shared_ptr<DeviceMesh> operator[](const std::string& name) const;
  std::string str() const;

 private:
  DeviceMesh() = default;
  std::shared_ptr<ProcessGroup> whole_;
  std::vector<int64_t> shape_, coord_;
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;
  mutable std::map<std::pair<int, int>, std::shared_ptr<ProcessGroup>> stream_groups_;
};

// A mesh over the initialised world.
std::shared_ptr<DeviceMesh> init_device_mesh(std::vector<int64_t> shape,
                                             std::vector<std::string> names = {});

// Expert parallel beside FSDP, as torchtitan lays it out (dp_shard_mod_ep x ep): `group` as the 2-D
// mesh {size / ep, ep} named {"dp_shard_mod_ep", "ep"}, rank r at (r / ep, r % ep).
// - group("ep"): the ep consecutive ranks of r's row. They hold different experts (r holds expert
//   shard r % ep: fsdp/distributed/expert_parallel.h) and exchange tokens with all_to_all_v.
// - group("dp_shard_mod_ep"): the size / ep ranks of r's column, which hold the same experts:
//   FSDP shards the experts over it (the sub-mesh mesh["dp_shard_mod_ep"]), while the other
//   parameters are sharded over the whole group (a 1-D mesh over it).
// ep = size is experts split over every rank (each expert then unsharded by FSDP); ep = 1 is
// plain FSDP. Collective over `group`; refuses an ep that does not divide its size.
std::shared_ptr<DeviceMesh> make_expert_mesh(std::shared_ptr<ProcessGroup> group, int64_t ep);
// The same over the initialised world.
std::shared_ptr<DeviceMesh> init_expert_mesh(int64_t ep);

}  // namespace fsdp::dist
