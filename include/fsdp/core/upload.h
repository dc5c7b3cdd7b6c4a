// Host-to-device copies that do not stop the host. A pageable copy (Tensor::to) waits for the
// whole device before it starts; an Uploader stages the tensor in page-locked host memory and
// queues the copy on the device's compute stream, so the kernels queued after it see the data
// and the host goes on at once.
//
// Each Uploader owns a ring of `slots` staging buffers. A slot is written again only after its
// previous copy has run (an event wait): with one upload per slot per step, that copy finished
// a step ago, so the wait returns at once. On a CPU device upload() returns its input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/tensor.h"

namespace fsdp {

class Uploader {
 public:
  explicit Uploader(Device device, int slots = 2);
  ~Uploader();
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // A tensor on the device with `host`'s shape, dtype and values (host: a CPU tensor).
  Tensor upload(const Tensor& host);
  Device device() const { return device_; }

 private:
  struct Slot {
    void* pinned = nullptr;
    int64_t capacity = 0;
    void* pending = nullptr;  // the last copy out of this slot, until waited for
  };
  Device device_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
};

}  // namespace fsdp
