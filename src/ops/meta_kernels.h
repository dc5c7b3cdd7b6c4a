// The kernels of the meta backend (src/ops/meta_ops.cpp): kernels/cpu's names, which launch
// nothing. The CPU backend's code compiled over them allocates what it allocates on the CPU (its
// widened copies, outputs and gradient buffers) and computes nothing; the attention kernels count
// the scratch kernels/cpu holds while they run. Private to the library.
#pragma once

#include <cstdint>

#include "fsdp/core/meta.h"
#include "kernels/cpu/cpu_kernels.h"

namespace fsdp::kernels::meta {

using cpu::AdamWArgs;
using cpu::AdamWSpan;

#define FSDP_META_KERNEL(name)   \
  template <class T, class... A> \
  void name(A&&...) {}
FSDP_META_KERNEL(gemm)
FSDP_META_KERNEL(add)
FSDP_META_KERNEL(add_inplace)
FSDP_META_KERNEL(bias_add_rows)
FSDP_META_KERNEL(sum_rows_into)
FSDP_META_KERNEL(scale)
FSDP_META_KERNEL(silu_forward)
FSDP_META_KERNEL(silu_backward)
FSDP_META_KERNEL(swiglu_forward)
FSDP_META_KERNEL(swiglu_backward)
FSDP_META_KERNEL(rmsnorm_forward)
FSDP_META_KERNEL(rmsnorm_backward)
FSDP_META_KERNEL(rope_qkv)
FSDP_META_KERNEL(attention_decode)
FSDP_META_KERNEL(adamw_multi)
FSDP_META_KERNEL(moe_combine)
FSDP_META_KERNEL(moe_combine_backward)
#undef FSDP_META_KERNEL

template <class... A>
void gemm_bf16(A&&...) {}

template <class T, class I, class... A>
void embedding_forward(A&&...) {}
template <class T, class I, class... A>
void embedding_backward(A&&...) {}
template <class T, class I, class... A>
void softmax_xent_backward(A&&...) {}
template <class T, class I, class... A>
double softmax_xent_forward(A&&...) {
  return 0.0;
}
template <class T, class... A>
double sum_squares(A&&...) {
  return 0.0;
}

// kernels/cpu/attention.cpp's per-thread scratch, held while the kernel runs.
template <class T, class... A>
void attention_forward(const T*, T*, T*, int64_t, int64_t T_, A&&...) {
  fsdp::meta::scratch(cpu::attention_scratch_bytes(false, T_, int64_t(sizeof(T))));
}
template <class T, class... A>
void attention_backward(const T*, const T*, const T*, const T*, T*, int64_t, int64_t T_, A&&...) {
  fsdp::meta::scratch(cpu::attention_scratch_bytes(true, T_, int64_t(sizeof(T))));
}

}  // namespace fsdp::kernels::meta
