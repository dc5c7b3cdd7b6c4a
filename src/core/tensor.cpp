// Tensor views and copies. Everything that touches elements goes to the
// cast kernels (CPU) or to cudaMemcpy plus the CUDA cast kernel.
#include "fsdp/core/tensor.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <utility>

#include "fsdp/core/allocator.h"
#include "fsdp/core/host_sync.h"
#include "src/core/copy.h"
#include "src/core/gpu.h"

namespace fsdp {

namespace {
std::atomic<int64_t> host_syncs{0};
}  // namespace

int64_t host_sync_count() { return host_syncs.load(); }

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  data_ = allocator_for(device).allocate(nbytes);
}

Storage::Storage(void* data, size_t nbytes, Device device, std::shared_ptr<void> owner)
    : data_(data), nbytes_(nbytes), device_(device), owner_(std::move(owner)) {}

Storage::~Storage() {
  if (owner_) return;  // external memory: the owner releases it
  if (data_ || nbytes_) allocator_for(device_).deallocate(data_, nbytes_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    FSDP_CHECK(d >= 0, "[Tensor::empty] negative size in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(size_t(shape_numel(shape)) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                         Device device) {
  FSDP_CHECK(owner, "[Tensor::from_blob] needs an owner that keeps the memory alive");
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, size_t(shape_numel(shape)) * dtype_size(dtype),
                                         device, std::move(owner));
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

int64_t Tensor::size(int d) const {
  if (d < 0) d += dim();
  FSDP_CHECK(d >= 0 && d < dim(), "[Tensor::size] dim {} out of range for shape {}", d,
             shape_str(shape_));
  return shape_[d];
}

bool Tensor::is_contiguous() const {
  return strides_ == contiguous_strides(shape_) || numel() <= 1;
}

void* Tensor::raw_data() const {
  FSDP_CHECK(defined(), "[Tensor] data of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * int64_t(dtype_size(dtype_));
}

Tensor Tensor::view(const Shape& shape) const {
  FSDP_CHECK(is_contiguous(), "[Tensor::view] needs a contiguous tensor; shape {} strides {}",
             shape_str(shape_), shape_str(strides_));
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < int(s.size()); ++i) {
    if (s[i] == -1) {
      FSDP_CHECK(infer < 0, "[Tensor::view] more than one -1 in {}", shape_str(shape));
      infer = i;
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    FSDP_CHECK(known > 0 && numel() % known == 0, "[Tensor::view] cannot view {} as {}",
               shape_str(shape_), shape_str(shape));
    s[infer] = numel() / known;
  }
  FSDP_CHECK(shape_numel(s) == numel(), "[Tensor::view] cannot view {} ({} elements) as {}",
             shape_str(shape_), numel(), shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::narrow(int d, int64_t start, int64_t length) const {
  if (d < 0) d += dim();
  FSDP_CHECK(d >= 0 && d < dim(), "[Tensor::narrow] dim {} out of range for shape {}", d,
             shape_str(shape_));
  FSDP_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d],
             "[Tensor::narrow] [{}, {}) is outside dim {} of size {}", start, start + length, d,
             shape_[d]);
  Tensor t = *this;
  t.shape_[d] = length;
  t.offset_ += start * strides_[d];
  return t;
}

Tensor Tensor::select(int64_t index) const {
  FSDP_CHECK(dim() >= 1, "[Tensor::select] needs at least one dim");
  Tensor t = narrow(0, index, 1);
  t.shape_.erase(t.shape_.begin());
  t.strides_.erase(t.strides_.begin());
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  if (a < 0) a += dim();
  if (b < 0) b += dim();
  FSDP_CHECK(a >= 0 && a < dim() && b >= 0 && b < dim(),
             "[Tensor::transpose] dims ({}, {}) for shape {}", a, b, shape_str(shape_));
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const { return contiguous().view(shape); }

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor t = empty(shape_, dtype, device());
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_(*this);
  return t;
}

const Tensor& Tensor::copy_(const Tensor& src) const {
  FSDP_CHECK(defined() && src.defined(), "[Tensor::copy_] undefined tensor");
  FSDP_CHECK(shape_ == src.shape_, "[Tensor::copy_] shape {} into shape {}", shape_str(src.shape_),
             shape_str(shape_));
  if (device().is_cpu() && src.device().is_cpu()) {
    detail::cpu_copy_cast(*this, src);
    return *this;
  }
  // A meta tensor holds no values: a copy into one does nothing, one out of it reads zeros.
  if (device().is_meta()) return *this;
  if (src.device().is_meta()) {
    FSDP_CHECK(device().is_cpu(), "[Tensor::copy_] a meta tensor copies to the CPU only, not to {}",
               device().str());
    detail::cpu_fill(*this, 0.0);
    return *this;
  }
  // Cross-device or CUDA copies go through contiguous buffers: cast on the
  // side that holds the wider type is not worth the complexity here.
  FSDP_CHECK(is_contiguous(), "[Tensor::copy_] a CUDA destination must be contiguous");
  FSDP_CHECK(src.is_contiguous() || src.device().is_cpu(),
             "[Tensor::copy_] a strided CUDA source ({} with strides [{}]) is not supported; copy "
             "its rows with ops::copy_segments",
             shape_str(src.shape_), fmt::join(src.strides_, ", "));
  Tensor s = src.contiguous();
  if (s.device() != device()) {
    host_syncs.fetch_add(1);
    Tensor staged = empty(shape_, s.dtype_, device());
    gpu::memcpy_sync(staged.raw_data(), staged.device(), s.raw_data(), s.device(), s.nbytes());
    s = staged;
  }
  if (device().is_cpu())
    detail::cpu_copy_cast(*this, s);
  else
    gpu::cast(raw_data(), dtype_, s.raw_data(), s.dtype_, numel(), device().index);
  return *this;
}

const Tensor& Tensor::fill_(double value) const {
  if (device().is_meta()) return *this;
  if (device().is_cpu()) {
    detail::cpu_fill(*this, value);
    return *this;
  }
  FSDP_CHECK(is_contiguous(), "[Tensor::fill_] a CUDA tensor must be contiguous");
  gpu::fill(raw_data(), dtype_, numel(), value, device().index);
  return *this;
}

double Tensor::item() const {
  FSDP_CHECK(numel() == 1, "[Tensor::item] needs exactly one element, the tensor has shape {}",
             shape_str(shape_));
  return to_f64_vector()[0];
}

std::vector<double> Tensor::to_f64_vector() const {
  if (device().is_cpu()) host_syncs.fetch_add(1);  // a CUDA tensor counts in its copy_ to the host
  Tensor t = to(Device::cpu()).to(DType::f64).contiguous();
  const double* p = t.data<double>();
  return std::vector<double>(p, p + t.numel());
}

}  // namespace fsdp
