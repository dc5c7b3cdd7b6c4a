// A process group of the meta device (fsdp/core/meta.h) for the memory plan: this process stands
// for rank `rank` of a world of `size`, so fully_shard lays out, allocates and frees each rank's
// shard shapes and buffers as the real world size does, while every collective completes at once
// and moves nothing. On meta tensors a collective does nothing. On host tensors (the small
// agreements: fully_shard's layout check, the step's target count) every rank is taken to hold
// what this one holds: an all-gather repeats this rank's block, a sum is size times it.
// Private to the library.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/distributed/process_group.h"

namespace fsdp::dist {

class MetaGroup final : public ProcessGroup {
 public:
  // `mesh`: the shape of the DeviceMesh to be built over this group (1 or 2 dims), whose
  // construction splits it once per dim of a 2-D mesh, in order; those splits, and any later one
  // (a stream group's), get the sizes of the mesh's dims, then this group's own.
  MetaGroup(int size, int rank, std::vector<int64_t> mesh = {});

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "meta"; }
  Device device() const override { return Device::meta(); }

  std::shared_ptr<Work> all_gather_into_tensor(const Tensor& out, const Tensor& in) override;
  std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& out, const Tensor& in,
                                              ReduceOp op) override;
  std::shared_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> broadcast(const Tensor& t, int root) override;
  std::shared_ptr<Work> all_to_all_single(const Tensor& out, const Tensor& in) override;
  // On host tensors every rank is taken to send this one what this one sends it, so the splits
  // must be equal and out becomes a copy of in (as all_to_all_single); anything else is refused.
  std::shared_ptr<Work> all_to_all_v(const Tensor& out, const std::vector<int64_t>& out_splits,
                                     const Tensor& in,
                                     const std::vector<int64_t>& in_splits) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<ProcessGroup> split(int color, int key) override;

 private:
  int size_, rank_;
  std::vector<int64_t> mesh_;
  int splits_ = 0;
};

}  // namespace fsdp::dist
