// Uploader: pinned staging slots and copies on the compute stream (see upload.h).
#include "fsdp/core/upload.h"

#include <cstring>

#include "fsdp/core/error.h"
#include "src/core/gpu.h"

namespace fsdp {

Uploader::Uploader(Device device, int slots) : device_(device) {
  FSDP_CHECK(slots >= 1, "[Uploader] needs at least one staging slot, got {}", slots);
  slots_.resize(size_t(slots));
}

Uploader::~Uploader() {
  for (Slot& s : slots_) {
    try {
      gpu::upload_wait(s.pending);
    } catch (...) {  // a destructor does not throw; the device's own error surfaces elsewhere
    }
    gpu::pinned_free(s.pinned);
  }
}

Tensor Uploader::upload(const Tensor& host) {
  FSDP_CHECK(host.device().is_cpu(), "[Uploader] uploads a CPU tensor, got one on {}",
             host.device().str());
  if (device_.is_cpu()) return host;
  if (device_.is_meta()) return Tensor::empty(host.shape(), host.dtype(), device_);  // no bytes
  const Tensor src = host.contiguous();
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  gpu::upload_wait(slot.pending);
  slot.pending = nullptr;
  const int64_t bytes = src.nbytes();
  if (slot.capacity < bytes) {
    gpu::pinned_free(slot.pinned);
    slot.pinned = nullptr;
    slot.capacity = 0;
    slot.pinned = gpu::pinned_alloc(bytes);
    slot.capacity = bytes;
  }
  if (bytes > 0) std::memcpy(slot.pinned, src.raw_data(), size_t(bytes));
  Tensor dst = Tensor::empty(src.shape(), src.dtype(), device_);
  if (bytes > 0)
    slot.pending = gpu::upload_async(dst.raw_data(), device_.index, slot.pinned, bytes);
  return dst;
}

}  // namespace fsdp
