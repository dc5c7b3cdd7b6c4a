// The ProcessGroup for CPU tensors: a Backend plus the communication thread
// that runs it. Private; created by init_process_group and split().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "fsdp/dist/process_group.h"
#include "src/dist/backend.h"

namespace fsdp::dist {

class CpuProcessGroup final : public ProcessGroup {
 public:
  explicit CpuProcessGroup(std::unique_ptr<Backend> backend);
  ~CpuProcessGroup() override;

  int rank() const override;
  int size() const override;
  std::string backend() const override;
  Device device() const override { return Device::cpu(); }
  std::shared_ptr<Work> all_gather_into_tensor(const Tensor& out, const Tensor& in) override;
  std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& out, const Tensor& in,
                                              ReduceOp op) override;
  std::shared_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> broadcast(const Tensor& t, int root) override;
  std::shared_ptr<Work> all_to_all_single(const Tensor& out, const Tensor& in) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<ProcessGroup> split(int color, int key) override;
  std::thread::id comm_thread_id() const override;
  double comm_seconds() const override { return stream_->busy_seconds(); }
  void set_label(const std::string& label) override;

 private:
  std::shared_ptr<Work> submit(const std::string& what, double bytes, std::function<void()> fn);
  void check_signature(const char* op, DType dtype, int64_t a, int64_t b);

  std::unique_ptr<Backend> be_;
  std::unique_ptr<CpuStream> stream_;
  bool check_;
  int split_seq_ = 0;
};

}  // namespace fsdp::dist
