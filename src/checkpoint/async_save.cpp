// AsyncSaver: checkpoint::save's three parts (src/checkpoint/save_parts.h) with the write on a
// thread of its own. The host copy is made into buffers kept from one save to the next (pinned on
// CUDA: cudaHostAlloc is slow, and a pageable copy would wait for the whole device), so a save
// after the first allocates nothing. One save is pending at most: the next save() waits for it,
// so one set of buffers is enough. The writer thread touches only the snapshot (host tensors,
// strings) and the files: never the model, the optimizer, a process group or a device stream.
#include "fsdp/checkpoint/async_save.h"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "src/checkpoint/save_parts.h"
#include "src/core/gpu.h"

namespace fsdp::checkpoint {

struct AsyncSaver::Impl {
  std::vector<Tensor> staging;  // host buffers, in the order the snapshot stages its flats
  std::optional<detail::SaveSnapshot> snap;
  detail::WriteResult result;
  std::atomic<int> state{int(WriteState::none)};
  std::jthread writer;
  std::shared_ptr<dist::ProcessGroup> world;
  OnCommit on_commit;  // the pending save's, run by its commit
  double blocking_seconds = 0;

  // A host buffer with `flat`'s shape and dtype: the i-th of this save, reused when it fits.
  Tensor buffer(size_t i, const Tensor& flat) {
    if (i < staging.size() && staging[i].shape() == flat.shape() &&
        staging[i].dtype() == flat.dtype())
      return staging[i];
    Tensor t;
    if (flat.device().is_cpu()) {
      t = Tensor::empty(flat.shape(), flat.dtype());
    } else {
      const auto bytes = int64_t(flat.nbytes());
      void* p = gpu::pinned_alloc(bytes);
      t = Tensor::from_blob(p, flat.shape(), flat.dtype(),
                            std::shared_ptr<void>(p, [](void* q) { gpu::pinned_free(q); }));
    }
    if (i < staging.size())
      staging[i] = t;
    else
      staging.push_back(t);
    return t;
  }

  void join() {
    if (writer.joinable()) writer.join();
  }
};

AsyncSaver::AsyncSaver() : impl_(std::make_unique<Impl>()) {}

AsyncSaver::~AsyncSaver() {
  if (impl_->writer.joinable()) {
    impl_->writer.request_stop();
    impl_->writer.join();
  }
}

AsyncSaver::WriteState AsyncSaver::state() const { return WriteState(impl_->state.load()); }

int64_t AsyncSaver::pending_step() const { return impl_->snap ? impl_->snap->step : -1; }

double AsyncSaver::last_blocking_seconds() const { return impl_->blocking_seconds; }

void AsyncSaver::save(const std::string& dir, int64_t step, FSDPModule& root,
                      const optim::Optimizer& opt, const std::string& config_json,
                      const std::shared_ptr<dist::ProcessGroup>& world, const Extras& extras,
                      OnCommit on_commit) {
  const auto t0 = std::chrono::steady_clock::now();
  wait();  // a second save waits for the first
  Impl& m = *impl_;
  detail::begin_save(dir, step, world, extras);
  size_t n = 0;
  std::vector<gpu::HostCopy> copies;
  int device = -1;
  detail::SaveSnapshot snap = detail::snapshot(
      dir, step, root, opt, config_json, world, extras, [&](const Tensor& flat) {
        FSDP_CHECK(flat.is_contiguous(), "[checkpoint] a shard buffer of shape {} is not contiguous",
                   shape_str(flat.shape()));
        Tensor host = m.buffer(n++, flat);
        if (flat.device().is_cpu()) {
          host.copy_(flat);
        } else {
          copies.push_back({host.raw_data(), flat.raw_data(), int64_t(flat.nbytes())});
          device = flat.device().index;
        }
        return host;
      });
  if (!copies.empty()) gpu::download(copies, device);  // one event for all of them
  m.snap = std::move(snap);
  m.world = world;
  m.on_commit = std::move(on_commit);
  m.state = int(WriteState::writing);
  m.writer = std::jthread([&m](std::stop_token stop) {
    m.result = detail::write_snapshot(*m.snap, stop);
    m.state = int(m.result.error ? WriteState::failed : WriteState::written);
  });
  m.blocking_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void AsyncSaver::wait() {
  Impl& m = *impl_;
  if (!m.snap) return;
  m.join();
  const detail::SaveSnapshot snap = std::move(*m.snap);
  const detail::WriteResult result = std::move(m.result);
  const OnCommit on_commit = std::move(m.on_commit);
  m.snap.reset();
  m.result = {};
  m.on_commit = {};
  m.state = int(WriteState::none);
  detail::commit_save(snap, result, m.world, /*background=*/true, on_commit);
}

}  // namespace fsdp::checkpoint
