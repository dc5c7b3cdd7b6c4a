// The device + host group: each collective goes to the half that owns its tensors.
#include "src/distributed/device_host_group.h"

#include <utility>

#include "fsdp/core/error.h"

namespace fsdp::dist {

DeviceHostGroup::DeviceHostGroup(std::shared_ptr<ProcessGroup> device_group,
                                 std::shared_ptr<ProcessGroup> host_group)
    : device_(std::move(device_group)), host_(std::move(host_group)) {
  FSDP_CHECK(device_ && host_, "[process_group] a device + host group needs both halves");
  FSDP_CHECK(device_->rank() == host_->rank() && device_->size() == host_->size(),
             "[process_group] the device half ({} of {}) and the host half ({} of {}) differ",
             device_->rank(), device_->size(), host_->rank(), host_->size());
}

std::string DeviceHostGroup::backend() const { return device_->backend() + "+" + host_->backend(); }

ProcessGroup& DeviceHostGroup::owner(const char* op, const Tensor& a, const Tensor& b) const {
  FSDP_CHECK(a.defined(), "[{}] the tensor is undefined", op);
  const bool on_device = !a.device().is_cpu();
  FSDP_CHECK(!b.defined() || b.device().is_cpu() != on_device,
             "[{}] one tensor is on {} and the other on {}: a collective runs on one engine", op,
             a.device().str(), b.device().str());
  return on_device ? *device_ : *host_;
}

std::shared_ptr<Work> DeviceHostGroup::all_gather_into_tensor(const Tensor& out, const Tensor& in) {
  return owner("all_gather_into_tensor", out, in).all_gather_into_tensor(out, in);
}
std::shared_ptr<Work> DeviceHostGroup::reduce_scatter_tensor(const Tensor& out, const Tensor& in,
                                                             ReduceOp op) {
  return owner("reduce_scatter_tensor", out, in).reduce_scatter_tensor(out, in, op);
}
std::shared_ptr<Work> DeviceHostGroup::all_reduce(const Tensor& t, ReduceOp op) {
  return owner("all_reduce", t).all_reduce(t, op);
}
std::shared_ptr<Work> DeviceHostGroup::broadcast(const Tensor& t, int root) {
  return owner("broadcast", t).broadcast(t, root);
}
std::shared_ptr<Work> DeviceHostGroup::all_to_all_single(const Tensor& out, const Tensor& in) {
  return owner("all_to_all_single", out, in).all_to_all_single(out, in);
}
std::shared_ptr<Work> DeviceHostGroup::all_to_all_v(const Tensor& out,
                                                    const std::vector<int64_t>& out_splits,
                                                    const Tensor& in,
                                                    const std::vector<int64_t>& in_splits) {
  return owner("all_to_all_v", out, in).all_to_all_v(out, out_splits, in, in_splits);
}
std::shared_ptr<Work> DeviceHostGroup::barrier() { return host_->barrier(); }

std::shared_ptr<ProcessGroup> DeviceHostGroup::split(int color, int key) {
  auto d = device_->split(color, key);  // both are collective over this group, in this order
  auto h = host_->split(color, key);
  if (!d || !h) return nullptr;
  return std::make_shared<DeviceHostGroup>(std::move(d), std::move(h));
}

void DeviceHostGroup::set_label(const std::string& label) {
  device_->set_label(label);
  host_->set_label(label);
}

}  // namespace fsdp::dist
