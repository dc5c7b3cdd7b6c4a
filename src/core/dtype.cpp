// dtype names and the f16 conversions (IEEE binary16, round to nearest even).
#include "fsdp/core/dtype.h"

#include <string>

#include "fsdp/core/error.h"

namespace fsdp {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "float32" || s == "fp32") return DType::f32;
  if (s == "f64" || s == "float64" || s == "fp64") return DType::f64;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f16" || s == "float16" || s == "fp16") return DType::f16;
  if (s == "i32" || s == "int32") return DType::i32;
  if (s == "i64" || s == "int64") return DType::i64;
  FSDP_FAIL("[dtype] unknown dtype '{}'; expected one of f32, f64, bf16, f16, i32, i64", s);
}

float f16_to_f32(f16 v) {
  uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t man = v.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while (!(man & 0x400u));
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16 f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return {uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u))};
  if (a >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};  // rounds to inf
  if (a < 0x38800000u) {                                    // subnormal or zero in f16
    float af;
    std::memcpy(&af, &a, 4);
    // 2^-24 is the f16 subnormal step; nearbyint rounds to even.
    uint32_t m = uint32_t(__builtin_nearbyintf(af * 16777216.0f));
    return {uint16_t(sign | m)};
  }
  uint32_t mant_odd = (a >> 13) & 1u;
  a += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return {uint16_t(sign | (a >> 13))};
}

}  // namespace fsdp
