// Type dispatch helpers for core copies, the CPU ops and host-side reductions: call a generic
// lambda with a value of the C++ type that matches a DType.
#pragma once

#include <cstdint>
#include <type_traits>

#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"

namespace fsdp {

// Scalar conversions between all element types, through float or double.
template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, bf16>) {
    return convert<To>(bf16_to_f32(v));
  } else if constexpr (std::is_same_v<From, f16>) {
    return convert<To>(f16_to_f32(v));
  } else if constexpr (std::is_same_v<To, bf16>) {
    return f32_to_bf16(float(v));
  } else if constexpr (std::is_same_v<To, f16>) {
    return f32_to_f16(float(v));
  } else {
    return To(v);
  }
}

template <class F>
decltype(auto) dispatch_all(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::bf16:
      return f(bf16{});
    case DType::f16:
      return f(f16{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
  }
  FSDP_FAIL("[dispatch] bad dtype");
}

// f32 and f64 only: the compute types of the CPU kernels.
template <class F>
decltype(auto) dispatch_compute(DType t, const char* op, F&& f) {
  if (t == DType::f32) return f(float{});
  if (t == DType::f64) return f(double{});
  FSDP_FAIL("[{}] computes in f32 or f64 on CPU, got {}", op, dtype_name(t));
}

template <class F>
decltype(auto) dispatch_index(DType t, const char* op, F&& f) {
  if (t == DType::i32) return f(int32_t{});
  if (t == DType::i64) return f(int64_t{});
  FSDP_FAIL("[{}] token ids must be i32 or i64, got {}", op, dtype_name(t));
}

}  // namespace fsdp
