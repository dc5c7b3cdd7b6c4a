// Validation and dispatch of the mixture of experts' combine and its backward (fsdp/ops/ops.h):
// the row indices' and weights' shapes, dtypes and devices are checked here, so the kernels trust
// what arrives (except pos's values, which only the CPU reads).
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/core/trace.h"
#include "fsdp/ops/ops.h"
#include "src/ops/backend.h"
#include "src/ops/cost.h"
#include "src/ops/op_checks.h"

namespace fsdp::ops {

using namespace detail;

namespace {

// rows [R, d]; pos i64 [N k]; weight undefined or f64 [N k]; all on one device. Returns N.
int64_t check_moe(const char* op, const Tensor& rows, const Tensor& pos, const Tensor& weight,
                  int64_t k) {
  FSDP_CHECK(k >= 1, "[{}] k must be at least 1, got {}", op, k);
  FSDP_CHECK(rows.dim() == 2, "[{}] rows must be [R, d], got {}", op, shape_str(rows.shape()));
  FSDP_CHECK(is_floating(rows.dtype()), "[{}] rows must be floating, got {}", op,
             dtype_name(rows.dtype()));
  FSDP_CHECK(pos.dim() == 1 && pos.dtype() == DType::i64 && pos.numel() % k == 0,
             "[{}] pos must be i64 [N k] with k {}, got {} {}", op, k, dtype_name(pos.dtype()),
             shape_str(pos.shape()));
  FSDP_CHECK(pos.device() == rows.device(), "[{}] pos on {} but rows on {}", op,
             pos.device().str(), rows.device().str());
  if (weight.defined())
    FSDP_CHECK(weight.dtype() == DType::f64 && weight.shape() == pos.shape() &&
                   weight.device() == rows.device(),
               "[{}] weight must be f64 {} on {}, got {} {} on {}", op, shape_str(pos.shape()),
               rows.device().str(), dtype_name(weight.dtype()), shape_str(weight.shape()),
               weight.device().str());
  return pos.numel() / k;
}

// t must be [n, d] in rows' dtype, on rows' device.
void check_token_rows(const char* op, const char* what, const Tensor& t, const Tensor& rows,
                      int64_t n) {
  FSDP_CHECK(t.dim() == 2 && t.size(0) == n && t.size(1) == rows.size(1),
             "[{}] {} must be [{}, {}], got {}", op, what, n, rows.size(1), shape_str(t.shape()));
  FSDP_CHECK(t.dtype() == rows.dtype() && t.device() == rows.device(),
             "[{}] {} is {} on {}, rows {} on {}", op, what, dtype_name(t.dtype()), t.device().str(),
             dtype_name(rows.dtype()), rows.device().str());
}

}  // namespace

Tensor moe_combine(const Tensor& rows, const Tensor& pos, const Tensor& weight, const Tensor& base,
                   int64_t k) {
  FSDP_OP_SCOPE("moe_combine", rows, ({&rows, &pos, &weight, &base}),
                cost::moe_combine(rows, pos, weight, base, k));
  const int64_t n = check_moe("moe_combine", rows, pos, weight, k);
  if (base.defined()) check_token_rows("moe_combine", "base", base, rows, n);
  if (on_meta({&rows, &pos, &weight, &base}))
    return meta_impl::moe_combine(rows, pos, weight, base, k);
  if (on_cuda("moe_combine", {&rows, &pos, &weight, &base}))
    return cuda_impl::moe_combine(rows, pos, weight, base, k);
  return cpu_impl::moe_combine(rows, pos, weight, base, k);
}

MoECombineGrad moe_combine_backward(const Tensor& dout, const Tensor& rows, const Tensor& pos,
                                    const Tensor& weight, int64_t k) {
  FSDP_OP_SCOPE("moe_combine_backward", rows, ({&dout, &rows, &pos, &weight}),
                cost::moe_combine_backward(dout, rows, pos, weight));
  const int64_t n = check_moe("moe_combine_backward", rows, pos, weight, k);
  check_token_rows("moe_combine_backward", "dout", dout, rows, n);
  if (on_meta({&dout, &rows, &pos, &weight}))
    return meta_impl::moe_combine_backward(dout, rows, pos, weight, k);
  if (on_cuda("moe_combine_backward", {&dout, &rows, &pos, &weight}))
    return cuda_impl::moe_combine_backward(dout, rows, pos, weight, k);
  return cpu_impl::moe_combine_backward(dout, rows, pos, weight, k);
}

}  // namespace fsdp::ops
