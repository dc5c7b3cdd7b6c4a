// Little-endian loads from a GGUF mapping, shared by the reader and the dequantizers
// (src/checkpoint/gguf_reader.cpp, ggml_quants.cpp). Private.
#pragma once

#include <cstdint>
#include <cstring>

#include "fsdp/core/dtype.h"

namespace fsdp::checkpoint::ggml {

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

inline float half(const uint8_t* p) { return f16_to_f32(f16{load<uint16_t>(p)}); }

}  // namespace fsdp::checkpoint::ggml
