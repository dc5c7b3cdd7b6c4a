// DTensor: a local tensor plus where it lies (a DeviceMesh and one Placement
// per mesh dim) and the global shape, with DTensor's operations:
//   from_local / to_local / full_tensor / distribute_tensor / redistribute
// Shards follow torch.chunk (uneven sizes leave the last chunks smaller or
// empty); when two mesh dims shard the same tensor dim, the later mesh dim
// chunks the earlier one's chunk. Redistribution moves one mesh dim at a
// time: Shard->Replicate is an all-gather, Partial->Replicate an all-reduce,
// Partial->Shard a reduce-scatter, Replicate->Shard a local chunk, and
// Shard(a)->Shard(b) an all-gather then a chunk.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/placement.h"
#include "fsdp/nn/module.h"

namespace fsdp::dist {

class DTensor {
 public:
  DTensor() = default;

  // Wraps this rank's piece. Without global_shape, shards are assumed even
  // (the global size of a sharded dim is the local size times the mesh size).
  static DTensor from_local(const Tensor& local, std::shared_ptr<DeviceMesh> mesh,
                            std::vector<Placement> placements,
                            std::optional<Shape> global_shape = std::nullopt);
  // Every rank passes a tensor of the full shape; the values of `src_rank`
  // (a rank of the mesh) are broadcast and then placed.
  static DTensor distribute_tensor(const Tensor& full, std::shared_ptr<DeviceMesh> mesh,
                                   std::vector<Placement> placements, int src_rank = 0);

  const Tensor& to_local() const { return local_; }
  Tensor full_tensor() const;                                            // collective
  DTensor redistribute(const std::vector<Placement>& placements) const;  // collective

  const Shape& shape() const { return shape_; }
  Shape stride() const { return contiguous_strides(shape_); }
  const std::vector<Placement>& placements() const { return placements_; }
  const std::shared_ptr<DeviceMesh>& mesh() const { return mesh_; }
  DType dtype() const { return local_.dtype(); }

  // The local shape of the rank at `coordinate` for these placements.
  static Shape local_shape(const Shape& global, const DeviceMesh& mesh,
                           const std::vector<Placement>& placements,
                           const std::vector<int64_t>& coordinate);

 private:
  Tensor local_;
  std::shared_ptr<DeviceMesh> mesh_;
  std::vector<Placement> placements_;
  Shape shape_;
};

// Where a parameter lies before fully_shard (nn::ParameterPlacement's form): a mesh and one
// placement per mesh dim of a tensor of global_shape. Parameter::shape is this rank's piece.
struct ParameterPlacement : nn::ParameterPlacement {
  std::shared_ptr<DeviceMesh> mesh;
  std::vector<Placement> placements;
  std::string str() const override;
  // [first, first + length) of tensor dim `dim` that this rank holds (the nested torch.chunk
  // ranges of the mesh dims that shard it, in mesh-dim order).
  std::pair<int64_t, int64_t> local_range(int dim) const;
};

// PyTorch's distribute_tensor for a module's parameter: `p` is whole (declared, or holding the
// whole tensor); it keeps this rank's piece (its shape, and its values when it has them, as a
// contiguous copy) and records the placement, so fully_shard composes with it and checkpoints see
// the global tensor. Shard(d) and Replicate; Partial is refused (a parameter's value is not a sum).
// Local: every rank of the mesh calls it with the same whole parameter.
void distribute_parameter(nn::Parameter& p, std::shared_ptr<DeviceMesh> mesh,
                          std::vector<Placement> placements, const std::string& name = "");
// DTensor::from_local for a parameter that already holds only this rank's piece (expert
// parallel's experts): records the placement of a tensor of `global_shape`, refusing a piece
// whose shape is not this rank's for it.
void from_local_parameter(nn::Parameter& p, std::shared_ptr<DeviceMesh> mesh,
                          std::vector<Placement> placements, Shape global_shape,
                          const std::string& name = "");

}  // namespace fsdp::dist
