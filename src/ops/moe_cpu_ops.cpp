// fsdp::ops' mixture-of-experts combine on CPU tensors (src/ops/backend.h; its checks in
// moe_ops.cpp). f32 and f64 rows are read as they are; bf16 and f16 rows are widened to f32
// (exactly), as every CPU op does. The sums are in f64 in every dtype, rounded to the rows' dtype
// (bf16 and f16 through f32, as Tensor::to narrows f64).
//
// Compiled twice, as cpu_ops.cpp is: here as cpu_impl over kernels/cpu, and by
// src/ops/moe_meta_ops.cpp (FSDP_OPS_META) as meta_impl over src/ops/meta_kernels.h, which
// allocates the same tensors on the meta device and reads nothing.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "src/core/dispatch.h"
#include "src/ops/backend.h"

#ifdef FSDP_OPS_META
#include "src/ops/meta_kernels.h"
#define FSDP_MOE_OPS_NAMESPACE meta_impl
#else
#define FSDP_MOE_OPS_NAMESPACE cpu_impl
#endif

namespace fsdp::ops::FSDP_MOE_OPS_NAMESPACE {

#ifdef FSDP_OPS_META
namespace moe_kernels = kernels::meta;
constexpr bool kMoeMeta = true;
#else
namespace moe_kernels = kernels::cpu;
constexpr bool kMoeMeta = false;
#endif

namespace {

Device moe_home() { return kMoeMeta ? Device::meta() : Device::cpu(); }

// The dtype the kernels read: f64 as it is, the others as f32.
DType moe_compute(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

Tensor widened(const Tensor& t, DType ct) {
  return t.defined() ? t.to(ct).contiguous() : Tensor();
}

// pos's rows in [0, rows); for a backward, each named once (its writes must not collide).
void check_pos(const char* op, const Tensor& pos, int64_t rows, bool once) {
  if constexpr (kMoeMeta) return;  // no values
  const int64_t* p = pos.data<int64_t>();
  std::vector<bool> seen(once ? static_cast<size_t>(rows) : 0);
  for (int64_t i = 0; i < pos.numel(); ++i) {
    FSDP_CHECK(p[i] >= 0 && p[i] < rows, "[{}] pos[{}] = {} is outside the {} rows", op, i, p[i],
               rows);
    if (once) {
      FSDP_CHECK(!seen[size_t(p[i])], "[{}] pos[{}] = {} names a row a second time", op, i, p[i]);
      seen[size_t(p[i])] = true;
    }
  }
}

}  // namespace

Tensor moe_combine(const Tensor& rows, const Tensor& pos, const Tensor& weight, const Tensor& base,
                   int64_t k) {
  const Tensor P = pos.contiguous();
  check_pos("moe_combine", P, rows.size(0), false);
  const int64_t n = P.numel() / k, d = rows.size(1);
  const DType ct = moe_compute(rows.dtype());
  const Tensor R = widened(rows, ct), B = widened(base, ct), W = widened(weight, DType::f64);
  Tensor out = Tensor::empty({n, d}, ct, moe_home());
  dispatch_compute(ct, "moe_combine", [&](auto tv) {
    using T = decltype(tv);
    moe_kernels::moe_combine<T>(R.data<T>(), P.data<int64_t>(),
                                W.defined() ? W.data<double>() : nullptr,
                                B.defined() ? B.data<T>() : nullptr, out.data<T>(), n, k, d);
  });
  return out.to(rows.dtype());
}

MoECombineGrad moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& pos,
                                    const Tensor& weight, int64_t k) {
  const Tensor P = pos.contiguous();
  check_pos("moe_combine_backward", P, rows.size(0), true);
  const int64_t n = P.numel() / k, d = rows.size(1);
  const DType ct = moe_compute(rows.dtype());
  const Tensor R = widened(rows, ct), G = widened(dout, ct), W = widened(weight, DType::f64);
  Tensor drows = Tensor::zeros(rows.shape(), ct, moe_home());
  Tensor dweight = Tensor::empty({n * k}, DType::f64, moe_home());
  dispatch_compute(ct, "moe_combine_backward", [&](auto tv) {
    using T = decltype(tv);
    moe_kernels::moe_combine_backward<T>(G.data<T>(), R.data<T>(), P.data<int64_t>(),
                                         W.defined() ? W.data<double>() : nullptr,
                                         drows.data<T>(), dweight.data<double>(), n, k, d);
  });
  return {drows.to(rows.dtype()), dweight};
}

}  // namespace fsdp::ops::FSDP_MOE_OPS_NAMESPACE

#undef FSDP_MOE_OPS_NAMESPACE
