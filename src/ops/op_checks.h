// The entry points' shared checks and dispatch tests (private to src/ops): which backend a call's
// tensors go to (meta, else CUDA, else CPU), the profiler's record of an op, and the dtype
// agreement the ops check. ops.cpp (most ops) and attention_ops.cpp (attention and rope) include
// it; the kernels behind them trust what passes these checks.
#pragma once

#include <initializer_list>
#include <string>

#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/core/trace.h"
#include "src/ops/cost.h"

namespace fsdp::ops::detail {

// True when the first defined tensor is on CUDA; then all must be on that device. A CUDA tensor
// in a build without CUDA goes to the no-CUDA backend, which says so.
// Meta tensors (core/meta.h) go to the meta backend, which makes the outputs and launches nothing;
// the CPU and CUDA tensors of a call are checked by on_cuda.
inline bool on_meta(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && t->device().is_meta()) return true;
  return false;
}

inline bool on_cuda(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts)
    if (t->defined()) {
      first = t;
      break;
    }
  if (!first || !first->device().is_cuda()) return false;
  for (const Tensor* t : ts)
    if (t->defined())
      FSDP_CHECK(t->device() == first->device(),
                 "[{}] inputs on {} and {}: move them to one device", op, first->device().str(),
                 t->device().str());
  return true;
}

inline std::string shapes_of(std::initializer_list<const Tensor*> ts) {
  std::string s;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!s.empty()) s += ", ";
    s += shape_str(t->shape());
  }
  return s;
}

// Records the op when the profiler is on: shapes, dtype, and its FLOPs and bytes by the
// formula in cost.h (evaluated only then).
#define FSDP_OP_SCOPE(name, first, inputs, cost_of)                                             \
  trace::Scope prof_scope_(name);                                                               \
  if (prof_scope_.on()) {                                                                       \
    const cost::Cost c_ = cost_of;                                                              \
    prof_scope_.set(::fsdp::ops::detail::shapes_of inputs, std::string(dtype_name((first).dtype())), c_.flops,       \
                    c_.bytes, (first).device().str());                                          \
  }

inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b, const char* an,
                      const char* bn) {
  FSDP_CHECK(a.dtype() == b.dtype(), "[{}] {} is {} but {} is {}", op, an, dtype_name(a.dtype()),
             bn, dtype_name(b.dtype()));
}

}  // namespace fsdp::ops::detail
