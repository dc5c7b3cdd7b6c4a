// Element types. f32 and f64 are compute types on CPU; bf16 and f16 are
// storage types there, widened to f32 for the math. i32 and i64 hold token
// ids. Conversions to and from bf16 round to nearest even, as PyTorch does.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace fsdp {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses "f32", "float32", "bf16", "bfloat16", ...; throws on anything else.
DType parse_dtype(std::string_view s);
inline bool is_floating(DType t) { return t != DType::i32 && t != DType::i64; }

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float bf16_to_f32(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
    return {uint16_t((u >> 16) | 0x40)};  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}
float f16_to_f32(f16 v);
f16 f32_to_f16(float f);

// Maps a C++ type to its DType.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}

}  // namespace fsdp
