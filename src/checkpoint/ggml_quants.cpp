// ggml's tensor types (names, block sizes) and the block dequantizers for the types fsdp.cpp
// reads. See include/fsdp/checkpoint/gguf.h.
//
// Exactness: the dequantizers do gguf-py's float operations in its order. The products of an f16
// scale and a small integer (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K) are exact in f32, so a fused multiply-add
// (the library builds with -ffp-contract=fast) rounds the same as a multiply then an add; Q6_K
// has no add, and its (d * scale) * q keeps gguf-py's association.
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "src/checkpoint/ggml_bytes.h"

namespace fsdp::checkpoint {

namespace {

struct TypeInfo {
  const char* name;
  uint32_t block, bytes;
};

// ggml's types with their block sizes (gguf-py's GGML_QUANT_SIZES).
const std::map<uint32_t, TypeInfo>& type_table() {
  static const std::map<uint32_t, TypeInfo> t = {
      {0, {"F32", 1, 4}},         {1, {"F16", 1, 2}},         {2, {"Q4_0", 32, 18}},
      {3, {"Q4_1", 32, 20}},      {6, {"Q5_0", 32, 22}},      {7, {"Q5_1", 32, 24}},
      {8, {"Q8_0", 32, 34}},      {9, {"Q8_1", 32, 40}},      {10, {"Q2_K", 256, 84}},
      {11, {"Q3_K", 256, 110}},   {12, {"Q4_K", 256, 144}},   {13, {"Q5_K", 256, 176}},
      {14, {"Q6_K", 256, 210}},   {15, {"Q8_K", 256, 292}},   {16, {"IQ2_XXS", 256, 66}},
      {17, {"IQ2_XS", 256, 74}},  {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}},
      {20, {"IQ4_NL", 32, 18}},   {21, {"IQ3_S", 256, 110}},  {22, {"IQ2_S", 256, 82}},
      {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},         {25, {"I16", 1, 2}},
      {26, {"I32", 1, 4}},        {27, {"I64", 1, 8}},        {28, {"F64", 1, 8}},
      {29, {"IQ1_M", 256, 56}},   {30, {"BF16", 1, 2}},       {34, {"TQ1_0", 256, 54}},
      {35, {"TQ2_0", 256, 66}},   {39, {"MXFP4", 32, 17}},
  };
  return t;
}
}  // namespace

std::string ggml_type_name(uint32_t type) {
  auto it = type_table().find(type);
  return it != type_table().end() ? it->second.name : fmt::format("type {}", type);
}

std::pair<uint32_t, uint32_t> ggml_block(uint32_t type) {
  auto it = type_table().find(type);
  if (it == type_table().end()) return {0, 0};
  return {it->second.block, it->second.bytes};
}

const char* ggml_readable_type_names() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K and Q6_K";
}

bool ggml_type_readable(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q6_K:
      return true;
  }
  return false;
}

void dequantize_row(uint32_t type, const uint8_t* src, float* dst, int64_t n) {
  FSDP_CHECK(ggml_type_readable(type), "[gguf] cannot dequantize {}: fsdp.cpp reads {}",
             ggml_type_name(type), ggml_readable_type_names());
  auto [block, bytes] = ggml_block(type);
  FSDP_CHECK(n >= 0 && n % block == 0, "[gguf] {} needs a multiple of {} elements, not {}",
             ggml_type_name(type), block, n);
  const int64_t nb = n / block;
  switch (GgmlType(type)) {
    case GgmlType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = ggml::half(src + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(bf16{ggml::load<uint16_t>(src + 2 * i)});
      return;
    case GgmlType::Q8_0:  // d (f16), 32 x int8: y = q * d
      for (int64_t b = 0; b < nb; ++b, src += bytes, dst += 32) {
        const float d = ggml::half(src);
        for (int j = 0; j < 32; ++j) dst[j] = float(int8_t(src[2 + j])) * d;
      }
      return;
    case GgmlType::Q4_0:  // d, 16 bytes: element j low nibble, j + 16 high; y = d * (q - 8)
      for (int64_t b = 0; b < nb; ++b, src += bytes, dst += 32) {
        const float d = ggml::half(src);
        const uint8_t* q = src + 2;
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * float(int(q[j] & 0xF) - 8);
          dst[j + 16] = d * float(int(q[j] >> 4) - 8);
        }
      }
      return;
    case GgmlType::Q4_1:  // d, m, 16 bytes as Q4_0; y = d * q + m
      for (int64_t b = 0; b < nb; ++b, src += bytes, dst += 32) {
        const float d = ggml::half(src), m = ggml::half(src + 2);
        const uint8_t* q = src + 4;
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * float(q[j] & 0xF) + m;
          dst[j + 16] = d * float(q[j] >> 4) + m;
        }
      }
      return;
    case GgmlType::Q5_0:  // d, 32 high bits (u32), 16 bytes of low nibbles as Q4_0; y = d * (q - 16)
    case GgmlType::Q5_1:  // d, m, 32 high bits, 16 bytes; y = d * q + m
      for (int64_t b = 0; b < nb; ++b, src += bytes, dst += 32) {
        const bool q5_1 = GgmlType(type) == GgmlType::Q5_1;
        const float d = ggml::half(src), m = q5_1 ? ggml::half(src + 2) : 0.f;
        const uint32_t qh = ggml::load<uint32_t>(src + (q5_1 ? 4 : 2));
        const uint8_t* q = src + (q5_1 ? 8 : 6);
        const int offset = q5_1 ? 0 : 16;
        for (int j = 0; j < 16; ++j) {
          const int lo = int((q[j] & 0xF) | (((qh >> j) & 1) << 4)) - offset;
          const int hi = int((q[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - offset;
          dst[j] = q5_1 ? d * float(lo) + m : d * float(lo);
          dst[j + 16] = q5_1 ? d * float(hi) + m : d * float(hi);
        }
      }
      return;
    case GgmlType::Q4_K:
      // d, dmin, 12 bytes of eight 6-bit scales and mins, 128 bytes of nibbles. Sub-block s
      // (32 elements) has scale sc[s] and min m[s]; chunk c (64 elements) takes bytes
      // [32c, 32c + 32), sub-block 2c from the low nibbles, 2c + 1 from the high ones.
      // y = (d * sc) * q - dmin * m.
      for (int64_t b = 0; b < nb; ++b, src += bytes, dst += 256) {
        const float d = ggml::half(src), dmin = ggml::half(src + 2);
        const uint8_t* s = src + 4;
        const uint8_t* q = src + 16;
        for (int sb = 0; sb < 8; ++sb) {
          int sc, mn;
          if (sb < 4) {
            sc = s[sb] & 63;
            mn = s[sb + 4] & 63;
          } else {
            sc = (s[sb + 4] & 0xF) | ((s[sb - 4] >> 6) << 4);
            mn = (s[sb + 4] >> 4) | ((s[sb] >> 6) << 4);
          }
          const float ds = d * float(sc), dm = dmin * float(mn);
          const uint8_t* qq = q + 32 * (sb / 2);
          const int shift = (sb % 2) * 4;
          for (int l = 0; l < 32; ++l) dst[32 * sb + l] = ds * float((qq[l] >> shift) & 0xF) - dm;
        }
      }
      return;
    case GgmlType::Q6_K:
      // 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales, d. Each half h
      // (128 elements) uses ql[64h..], qh[32h..], scales[8h..]: for l < 32, elements l, l + 32,
      // l + 64, l + 96 take ql[l] low, ql[l + 32] low, ql[l] high, ql[l + 32] high nibbles and
      // qh[l] bits 0-1, 2-3, 4-5, 6-7; q - 32 times d * scale of its 16 elements.
      for (int64_t b = 0; b < nb; ++b, src += bytes, dst += 256) {
        const uint8_t* ql = src;
        const uint8_t* qh = src + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
        const float d = ggml::half(src + 208);
        for (int h = 0; h < 2; ++h) {
          float* y = dst + 128 * h;
          const uint8_t* L = ql + 64 * h;
          const uint8_t* H = qh + 32 * h;
          const int8_t* S = sc + 8 * h;
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = int((L[l] & 0xF) | (((H[l] >> 0) & 3) << 4)) - 32;
            const int q2 = int((L[l + 32] & 0xF) | (((H[l] >> 2) & 3) << 4)) - 32;
            const int q3 = int((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32;
            const int q4 = int((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32;
            y[l] = (d * float(S[is + 0])) * float(q1);
            y[l + 32] = (d * float(S[is + 2])) * float(q2);
            y[l + 64] = (d * float(S[is + 4])) * float(q3);
            y[l + 96] = (d * float(S[is + 6])) * float(q4);
          }
        }
      }
      return;
  }
}

}  // namespace fsdp::checkpoint
