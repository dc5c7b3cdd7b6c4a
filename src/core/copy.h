// Element copies of CPU tensors for core (Tensor::copy_ and fill_): any
// strides, any dtypes. Private to the library.
#pragma once

#include "fsdp/core/tensor.h"

namespace fsdp::detail {

void cpu_copy_cast(const Tensor& dst, const Tensor& src);  // dst = src, element by element
void cpu_fill(const Tensor& dst, double value);

}  // namespace fsdp::detail
