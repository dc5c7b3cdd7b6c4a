// Host-side launchers of the CUDA kernels. This header includes no device
// code and no CUDA header, so host files can include it freely. Every
// launcher takes its stream explicitly (nullptr: the legacy default stream)
// and the device index to run on. Private to the library.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"

namespace fsdp::kernels::cuda {

// Blocking copy between any two devices (host <-> device or device <-> device).
void memcpy_sync(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes);

// cast.cu: dst[i] = convert(src[i]) for contiguous buffers of n elements.
void cast(void* dst, DType dst_t, const void* src, DType src_t, int64_t n, int device, void* stream);
void fill(void* dst, DType t, int64_t n, double value, int device, void* stream);

// elementwise.cu: out = a + b.
void add(const void* a, const void* b, void* out, DType t, int64_t n, int device, void* stream);

}  // namespace fsdp::kernels::cuda
