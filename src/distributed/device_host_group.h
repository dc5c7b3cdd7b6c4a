// A world of CUDA ranks on NCCL also needs a host engine: shapes, losses and
// other small control values live in host memory, and NCCL takes only device
// tensors. This group holds both halves and sends each collective to the one
// that owns its tensors (PyTorch's init_process_group(backend="cpu:gloo,cuda:nccl")):
// NCCL for CUDA tensors, MPI or Gloo (whichever the launch provides) for host
// tensors. Both halves span the same ranks in the same order, and split()
// splits both. Private; made by init_process_group.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/distributed/process_group.h"

namespace fsdp::dist {

class DeviceHostGroup final : public ProcessGroup {
 public:
  DeviceHostGroup(std::shared_ptr<ProcessGroup> device_group,
                  std::shared_ptr<ProcessGroup> host_group);

  int rank() const override { return device_->rank(); }
  int size() const override { return device_->size(); }
  std::string backend() const override;  // "nccl+mpi", "nccl+gloo", "nccl+local"
  Device device() const override { return device_->device(); }
  std::shared_ptr<Work> all_gather_into_tensor(const Tensor& out, const Tensor& in) override;
  std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& out, const Tensor& in,
                                              ReduceOp op) override;
  std::shared_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> broadcast(const Tensor& t, int root) override;
  std::shared_ptr<Work> all_to_all_single(const Tensor& out, const Tensor& in) override;
  std::shared_ptr<Work> all_to_all_v(const Tensor& out, const std::vector<int64_t>& out_splits,
                                     const Tensor& in,
                                     const std::vector<int64_t>& in_splits) override;
  std::shared_ptr<Work> barrier() override;  // on the host engine: it blocks the host
  std::shared_ptr<ProcessGroup> split(int color, int key) override;
  std::thread::id comm_thread_id() const override { return host_->comm_thread_id(); }
  double comm_seconds() const override { return host_->comm_seconds(); }
  void set_label(const std::string& label) override;

  const std::shared_ptr<ProcessGroup>& device_group() const { return device_; }
  const std::shared_ptr<ProcessGroup>& host_group() const { return host_; }

 private:
  // The half that owns `t`; a collective's tensors must all be on one side.
  ProcessGroup& owner(const char* op, const Tensor& a, const Tensor& b = Tensor()) const;

  std::shared_ptr<ProcessGroup> device_, host_;
};

}  // namespace fsdp::dist
