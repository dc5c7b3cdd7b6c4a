// The ProcessGroup of a CPU engine (MPI, Gloo, local): a Transport plus the
// communication thread that runs it. Private; created by init_process_group
// and split().
//
// With a CUDA tensor device (fsdp-train --device cuda --backend gloo|mpi), it
// also takes CUDA tensors, staged as PyTorch's Gloo does: on the
// communication thread, a copy to host memory (on the device's legacy stream,
// so it follows the compute already queued), the host collective, and a copy
// back; Work::wait() returns once the result is on the device. That lets
// several processes share one GPU and run every multi-rank path of
// fully_shard, which NCCL (one rank per GPU) cannot.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/distributed/process_group.h"
#include "src/distributed/transport.h"
#include "src/distributed/watchdog.h"

namespace fsdp::dist {

class CpuProcessGroup final : public ProcessGroup {
 public:
  explicit CpuProcessGroup(std::unique_ptr<Transport> transport, Device tensor_device = Device::cpu());
  ~CpuProcessGroup() override;

  int rank() const override;
  int size() const override;
  std::string backend() const override;
  Device device() const override { return device_; }
  std::shared_ptr<Work> all_gather_into_tensor(const Tensor& out, const Tensor& in) override;
  std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& out, const Tensor& in,
                                              ReduceOp op) override;
  std::shared_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> broadcast(const Tensor& t, int root) override;
  std::shared_ptr<Work> all_to_all_single(const Tensor& out, const Tensor& in) override;
  std::shared_ptr<Work> all_to_all_v(const Tensor& out, const std::vector<int64_t>& out_splits,
                                     const Tensor& in,
                                     const std::vector<int64_t>& in_splits) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<ProcessGroup> split(int color, int key) override;
  // Check mode (FSDP_DIST_DEVICE_CHECK): this group stands in for the NCCL half of a device +
  // host world on a machine without a GPU, and refuses every tensor handed to it, as NCCL
  // refuses host tensors. Its splits inherit the mode.
  void declare_device_stand_in() { device_stand_in_ = true; }
  std::thread::id comm_thread_id() const override;
  double comm_seconds() const override { return stream_->busy_seconds(); }
  void set_label(const std::string& label) override;

 private:
  std::shared_ptr<Work> submit(const std::string& what, double bytes, std::function<void()> fn);
  // Runs `host_call` on host copies of CUDA tensors: `ins` are copied to the host first, `outs`
  // back to the device after (a tensor may be both).
  std::shared_ptr<Work> staged(
      const char* op, const std::vector<Tensor>& ins, const std::vector<Tensor>& outs,
      const std::function<std::shared_ptr<Work>(const std::vector<Tensor>& host)>& host_call);
  bool on_device(std::initializer_list<const Tensor*> ts) const;
  void check_tensor(const char* op, const Tensor& t, const char* what) const;
  void check_signature(const char* op, DType dtype, int64_t a, int64_t b);

  std::unique_ptr<Transport> transport_;
  Device device_;
  std::unique_ptr<CpuStream> stream_;
  std::shared_ptr<watchdog::Counter> counter_;  // its collectives, numbered, on the progress board
  bool check_;
  bool device_stand_in_ = false;
  int split_seq_ = 0;
};

}  // namespace fsdp::dist
