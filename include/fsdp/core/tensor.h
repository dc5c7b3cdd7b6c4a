// Tensor: a strided view of shared storage, as in PyTorch. Several tensors
// may share one Storage (views); the storage returns its bytes to the
// device allocator when the last view goes. Shapes are int64 and strides
// count elements, not bytes. Views never copy; contiguous(), clone(), to()
// copy when they must. Element access goes through data<T>(), which checks
// that T matches the dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"

namespace fsdp {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  // Memory owned elsewhere (an mmap, say): `owner` keeps it alive, and the
  // allocator neither counts nor frees it.
  Storage(void* data, size_t nbytes, Device device, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::shared_ptr<void> owner_;
};

class Tensor {
 public:
  Tensor() = default;

  // Factories. empty() leaves the bytes uninitialised.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype, Device device = Device::cpu());
  // A view of memory owned by `owner` (zero copy), e.g. an mmap'ed file.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                          Device device = Device::cpu());
  template <class T>
  static Tensor from_vector(const std::vector<T>& v, const Shape& shape) {
    Tensor t = empty(shape, dtype_of<T>());
    FSDP_CHECK(int64_t(v.size()) == t.numel(), "[Tensor::from_vector] {} values for shape {}",
               v.size(), shape_str(shape));
    std::copy(v.begin(), v.end(), t.data<T>());
    return t;
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int dim() const { return int(shape_.size()); }
  int64_t size(int d) const;
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool shares_storage_with(const Tensor& o) const { return storage_ && storage_ == o.storage_; }

  void* raw_data() const;
  template <class T>
  T* data() const {
    FSDP_CHECK(dtype_of<T>() == dtype_, "[Tensor::data] asked for {} but the tensor holds {}",
               dtype_name(dtype_of<T>()), dtype_name(dtype_));
    return static_cast<T*>(raw_data());
  }

  // Views. They share storage with *this.
  Tensor view(const Shape& shape) const;  // contiguous only; one dim may be -1
  Tensor narrow(int dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t start, int64_t end) const { return narrow(0, start, end - start); }
  Tensor select(int64_t index) const;  // drops dim 0
  Tensor transpose(int a, int b) const;
  Tensor flatten() const { return view({numel()}); }

  // Copies.
  Tensor reshape(const Shape& shape) const;  // a view when contiguous, else a copy
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;    // a cast; returns *this when the dtype matches
  Tensor to(Device device) const;  // returns *this when the device matches

  // In place. A Tensor is a handle, so these are const: they change the
  // elements, not the view.
  const Tensor& copy_(const Tensor& src) const;  // same shape; casts dtype, crosses devices
  const Tensor& fill_(double value) const;
  const Tensor& zero_() const { return fill_(0.0); }

  double item() const;                        // numel() == 1
  std::vector<double> to_f64_vector() const;  // any dtype, any layout, CPU or CUDA

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_, strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::f32;
};

Shape contiguous_strides(const Shape& shape);

}  // namespace fsdp
