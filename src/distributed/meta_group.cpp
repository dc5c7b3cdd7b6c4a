// MetaGroup (src/distributed/meta_group.h): collectives that complete at once, for the memory plan.
#include "src/distributed/meta_group.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/meta.h"
#include "fsdp/core/tensor.h"
#include "src/distributed/split_sizes.h"

namespace fsdp::dist {

namespace {

// A collective's tensors stay alive until it is waited for, as the CPU engines' tasks hold
// theirs on the communication thread (at most that long); a reduction in a narrow dtype on the CPU
// holds its f32 copies too (src/distributed/cpu_group.cpp).
class Done final : public Work {
 public:
  explicit Done(std::vector<Tensor> held) : held_(std::move(held)) {}
  void wait() override { held_.clear(); }
  bool is_completed() const override { return true; }

 private:
  std::vector<Tensor> held_;
};

std::shared_ptr<Work> done(std::vector<Tensor> held = {}, bool reduces = false) {
  if (reduces && !held.empty() && held[0].device().is_meta() && meta::target().device.is_cpu() &&
      (held[0].dtype() == DType::bf16 || held[0].dtype() == DType::f16)) {
    const size_t n = held.size();
    for (size_t i = 0; i < n; ++i)
      held.push_back(Tensor::empty(held[i].shape(), DType::f32, Device::meta()));
  }
  return std::make_shared<Done>(std::move(held));
}

bool on_host(const Tensor& t) { return t.defined() && t.device().is_cpu(); }

}  // namespace

MetaGroup::MetaGroup(int size, int rank, std::vector<int64_t> mesh)
    : size_(size), rank_(rank), mesh_(std::move(mesh)) {
  FSDP_CHECK(size >= 1 && rank >= 0 && rank < size, "[meta group] rank {} of {}", rank, size);
  int64_t n = 1;
  for (int64_t d : mesh_) n *= d;
  FSDP_CHECK(mesh_.size() <= 2 && (mesh_.empty() || n == size),
             "[meta group] a mesh of {} dims holding {} ranks over a group of {}", mesh_.size(), n,
             size);
}

std::shared_ptr<Work> MetaGroup::all_gather_into_tensor(const Tensor& out, const Tensor& in) {
  FSDP_CHECK(out.numel() == in.numel() * size_,
             "[meta group] all_gather: {} elements out for {} in over {} ranks", out.numel(),
             in.numel(), size_);
  if (on_host(out)) {  // every rank's block is this one's
    const Tensor flat = out.reshape({size_, in.numel()});
    for (int r = 0; r < size_; ++r) flat.select(r).copy_(in.reshape({in.numel()}));
  }
  return done({in, out});
}

std::shared_ptr<Work> MetaGroup::reduce_scatter_tensor(const Tensor& out, const Tensor& in,
                                                       ReduceOp op) {
  FSDP_CHECK(in.numel() == out.numel() * size_,
             "[meta group] reduce_scatter: {} elements in for {} out over {} ranks", in.numel(),
             out.numel(), size_);
  if (on_host(out)) {
    out.copy_(in.reshape({size_, out.numel()}).select(rank_).reshape(out.shape()));
    if (op == ReduceOp::SUM) all_reduce(out, op);
  }
  return done({in, out}, true);
}

std::shared_ptr<Work> MetaGroup::all_reduce(const Tensor& t, ReduceOp op) {
  if (on_host(t) && op == ReduceOp::SUM && size_ > 1) {  // size equal terms
    const std::vector<double> v = t.to_f64_vector();
    Tensor sum = Tensor::empty({int64_t(v.size())}, DType::f64);
    for (size_t i = 0; i < v.size(); ++i) sum.data<double>()[i] = v[i] * double(size_);
    t.copy_(sum.reshape(t.shape()));
  }
  return done({t}, true);
}

std::shared_ptr<Work> MetaGroup::broadcast(const Tensor&, int root) {
  FSDP_CHECK(root >= 0 && root < size_, "[meta group] broadcast from rank {} of {}", root, size_);
  return done();
}

std::shared_ptr<Work> MetaGroup::all_to_all_single(const Tensor& out, const Tensor& in) {
  FSDP_CHECK(out.numel() == in.numel(), "[meta group] all_to_all: {} elements out for {} in",
             out.numel(), in.numel());
  if (on_host(out)) out.copy_(in);
  return done();
}

std::shared_ptr<Work> MetaGroup::all_to_all_v(const Tensor& out,
                                              const std::vector<int64_t>& out_splits,
                                              const Tensor& in,
                                              const std::vector<int64_t>& in_splits) {
  check_split_sizes("meta group: all_to_all_v", size_, out, out_splits, in, in_splits);
  if (on_host(out)) {
    FSDP_CHECK(out_splits == in_splits,
               "[meta group] all_to_all_v on host tensors needs out_splits equal to in_splits "
               "(every rank is taken to hold what this one holds)");
    out.copy_(in);
  }
  return done({in, out});
}

std::shared_ptr<Work> MetaGroup::barrier() { return done(); }

std::shared_ptr<ProcessGroup> MetaGroup::split(int color, int key) {
  if (color < 0) return nullptr;
  // A 2-D mesh's construction splits dim 0's group (the same column), then dim 1's (the row).
  if (mesh_.size() == 2 && splits_ < 2) {
    const int d = splits_++;
    const int64_t coord = d == 0 ? rank_ / mesh_[1] : rank_ % mesh_[1];
    (void)key;
    return std::make_shared<MetaGroup>(int(mesh_[size_t(d)]), int(coord));
  }
  return std::make_shared<MetaGroup>(size_, rank_);  // a duplicate (a stream group)
}

}  // namespace fsdp::dist
