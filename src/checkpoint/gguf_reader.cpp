// GGUF reader: a bounds-checked cursor over a read-only mapping, the ggml block dequantizers
// and the "gpt2" tokenizer as a tokenizer.json. See include/fsdp/checkpoint/gguf.h.
//
// Every read goes through Cursor, which refuses to step past the end of the file; every count
// read from the file is compared with the bytes left (each element takes at least one byte,
// or eight for a string's length) before a container is sized from it.
//
// Exactness: the dequantizers do gguf-py's float operations in its order. The products of an f16
// scale and a small integer (Q4_0, Q4_1, Q8_0, Q4_K) are exact in f32, so a fused multiply-add
// (the library builds with -ffp-contract=fast) rounds the same as a multiply then an add; Q6_K
// has no add, and its (d * scale) * q keeps gguf-py's association.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/core/error.h"

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

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

float half(const uint8_t* p) { return f16_to_f32(f16{load<uint16_t>(p)}); }

// A bounds-checked reader of the header; `path` names the file in every error.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& path)
      : base_(base), size_(size), path_(path) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  const uint8_t* take(uint64_t n, const char* what) {
    FSDP_CHECK(n <= left(),
               "[gguf] {}: {} needs {} bytes at offset {} but the file ends at {} (truncated?)",
               path_, what, n, pos_, size_);
    const uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }
  template <class T>
  T get(const char* what) {
    return load<T>(take(sizeof(T), what));
  }
  std::string str(const char* what) {
    const uint64_t n = get<uint64_t>(what);
    FSDP_CHECK(n <= left(), "[gguf] {}: {} has length {} at offset {} but only {} bytes are left",
               path_, what, n, pos_ - 8, left());
    const uint8_t* p = take(n, what);
    return std::string(reinterpret_cast<const char*>(p), size_t(n));
  }
  // A count of items each at least `min_bytes` long, checked against the bytes left.
  uint64_t count(const char* what, uint64_t min_bytes) {
    const uint64_t n = get<uint64_t>(what);
    FSDP_CHECK(n <= left() / min_bytes,
               "[gguf] {}: {} is {} but only {} bytes are left (corrupt count?)", path_, what, n,
               left());
    return n;
  }

 private:
  const uint8_t* base_;
  uint64_t size_, pos_ = 0;
  const std::string& path_;
};

uint64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
    case GgufType::string:  // its length
      return 8;
    case GgufType::array:
      return 0;
  }
  return 0;
}

bool known_type(uint32_t t) { return t <= uint32_t(GgufType::f64); }

// One scalar of type t; integers and bools into *i, floats into *d, strings into *s.
void read_scalar(Cursor& c, GgufType t, const std::string& key, const std::string& path, int64_t* i,
                 double* d, std::string* s) {
  switch (t) {
    case GgufType::u8:
      *i = c.get<uint8_t>("a u8 value");
      return;
    case GgufType::i8:
      *i = c.get<int8_t>("an i8 value");
      return;
    case GgufType::u16:
      *i = c.get<uint16_t>("a u16 value");
      return;
    case GgufType::i16:
      *i = c.get<int16_t>("an i16 value");
      return;
    case GgufType::u32:
      *i = c.get<uint32_t>("a u32 value");
      return;
    case GgufType::i32:
      *i = c.get<int32_t>("an i32 value");
      return;
    case GgufType::i64:
      *i = c.get<int64_t>("an i64 value");
      return;
    case GgufType::u64: {
      const uint64_t u = c.get<uint64_t>("a u64 value");
      FSDP_CHECK(u <= uint64_t(std::numeric_limits<int64_t>::max()),
                 "[gguf] {}: key '{}' holds the u64 {}, beyond what fsdp.cpp reads (2^63 - 1)",
                 path, key, u);
      *i = int64_t(u);
      return;
    }
    case GgufType::boolean: {
      const uint8_t b = c.get<uint8_t>("a bool value");
      FSDP_CHECK(b <= 1, "[gguf] {}: key '{}' holds the bool byte {}, neither 0 nor 1", path, key,
                 b);
      *i = b;
      return;
    }
    case GgufType::f32:
      *d = c.get<float>("an f32 value");
      return;
    case GgufType::f64:
      *d = c.get<double>("an f64 value");
      return;
    case GgufType::string:
      *s = c.str("a string value");
      return;
    case GgufType::array:
      break;
  }
  FSDP_FAIL("[gguf] {}: key '{}': unexpected value type {}", path, key, uint32_t(t));
}

bool is_float(GgufType t) { return t == GgufType::f32 || t == GgufType::f64; }

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

bool ggml_type_readable(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q6_K:
      return true;
  }
  return false;
}

std::string_view gguf_type_name(GgufType t) {
  static constexpr const char* names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                          "bool", "string", "array", "u64", "i64", "f64"};
  return known_type(uint32_t(t)) ? names[uint32_t(t)] : "unknown";
}

bool GgufValue::is_integer() const {
  return type != GgufType::array && type != GgufType::string && !is_float(type);
}

size_t GgufValue::array_size() const { return integers.size() + reals.size() + strs.size(); }

Shape GgufTensorInfo::shape() const { return Shape(ne.rbegin(), ne.rend()); }

int64_t GgufTensorInfo::rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
  return r;
}

uint64_t GgufTensorInfo::row_bytes() const {
  auto [block, bytes] = ggml_block(type);
  return uint64_t(ne[0]) / block * bytes;
}

int64_t gguf_row_of_hf(int64_t r, int64_t n_rows, int64_t n_head) {
  FSDP_CHECK(n_head > 0 && n_rows % (2 * n_head) == 0 && r >= 0 && r < n_rows,
             "[gguf] q/k row {} of {} rows cannot be unpermuted for {} heads (rows must be a "
             "multiple of 2 * heads)",
             r, n_rows, n_head);
  // HF row h*hd + j*(hd/2) + i sits at GGUF row h*hd + 2*i + j.
  const int64_t hd = n_rows / n_head, half = hd / 2;
  const int64_t h = r / hd, in = r % hd;
  return h * hd + 2 * (in % half) + in / half;
}

// ---------------------------------------------------------------- parsing

GgufFile::GgufFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  FSDP_CHECK(fd >= 0, "[gguf] cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    FSDP_FAIL("[gguf] cannot stat '{}': {}", path, std::strerror(e));
  }
  size_ = uint64_t(st.st_size);
  void* base = nullptr;
  if (size_ > 0) {
    base = ::mmap(nullptr, size_t(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    ::close(fd);
    FSDP_CHECK(base != MAP_FAILED, "[gguf] mmap of '{}' ({} bytes) failed: {}", path, size_,
               std::strerror(e));
  } else {
    ::close(fd);
  }
  const uint64_t size = size_;
  map_ =
      std::shared_ptr<const uint8_t>(static_cast<const uint8_t*>(base), [size](const uint8_t* p) {
        if (p) ::munmap(const_cast<uint8_t*>(p), size_t(size));
      });

  Cursor c(map_.get(), size_, path_);
  FSDP_CHECK(size_ >= 4 && std::memcmp(map_.get(), "GGUF", 4) == 0,
             "[gguf] {}: not a GGUF file (no \"GGUF\" magic in its first 4 bytes)", path);
  c.take(4, "the magic");
  version_ = c.get<uint32_t>("the version");
  FSDP_CHECK(version_ != 0x02000000u && version_ != 0x03000000u,
             "[gguf] {}: a big-endian GGUF file; fsdp.cpp reads little-endian ones", path);
  FSDP_CHECK(version_ == 2 || version_ == 3,
             "[gguf] {}: GGUF version {} is not supported; expected 2 or 3", path, version_);
  // A tensor info takes at least 8 (name length) + 4 (dims) + 8 (one dim) + 4 + 8 bytes; a
  // key/value at least 8 (key length) + 4 (type) + 1.
  const uint64_t n_tensors = c.get<uint64_t>("the tensor count");
  const uint64_t n_kv = c.count("the key/value count", 13);
  FSDP_CHECK(n_tensors <= c.left() / 32,
             "[gguf] {}: the tensor count is {} but only {} bytes are left (corrupt count?)", path,
             n_tensors, c.left());

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.str("a key");
    FSDP_CHECK(!kv_.count(key), "[gguf] {}: key '{}' appears twice", path, key);
    GgufValue v;
    const uint32_t t = c.get<uint32_t>("a value type");
    FSDP_CHECK(known_type(t), "[gguf] {}: key '{}' has value type {}, not a GGUF type (0 to 12)",
               path, key, t);
    v.type = GgufType(t);
    if (v.type == GgufType::array) {
      const uint32_t et = c.get<uint32_t>("an array's element type");
      FSDP_CHECK(known_type(et) && GgufType(et) != GgufType::array,
                 "[gguf] {}: key '{}' is an array of type {} ({}); arrays of scalars or strings "
                 "are read",
                 path, key, et, gguf_type_name(GgufType(et)));
      v.array_type = GgufType(et);
      const uint64_t n = c.count("an array's length", scalar_size(v.array_type));
      if (v.array_type == GgufType::string)
        v.strs.reserve(size_t(n));
      else if (is_float(v.array_type))
        v.reals.reserve(size_t(n));
      else
        v.integers.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) {
        int64_t iv = 0;
        double dv = 0;
        std::string sv;
        read_scalar(c, v.array_type, key, path, &iv, &dv, &sv);
        if (v.array_type == GgufType::string)
          v.strs.push_back(std::move(sv));
        else if (is_float(v.array_type))
          v.reals.push_back(dv);
        else
          v.integers.push_back(iv);
      }
    } else {
      read_scalar(c, v.type, key, path, &v.integer, &v.real, &v.str);
    }
    key_order_.push_back(key);
    kv_.emplace(std::move(key), std::move(v));
  }

  if (has("general.alignment")) {
    const GgufValue& a = at("general.alignment");
    FSDP_CHECK(a.type == GgufType::u32 && a.integer > 0 && (a.integer & (a.integer - 1)) == 0,
               "[gguf] {}: general.alignment must be a u32 power of two, not {} ({})", path,
               a.is_integer() ? std::to_string(a.integer) : "a value", gguf_type_name(a.type));
    alignment_ = uint64_t(a.integer);
  }

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo ti;
    ti.name = c.str("a tensor name");
    FSDP_CHECK(!by_name_.count(ti.name), "[gguf] {}: tensor '{}' appears twice", path, ti.name);
    const uint32_t n_dims = c.get<uint32_t>("a tensor's dim count");
    FSDP_CHECK(n_dims >= 1 && n_dims <= 4, "[gguf] {}: tensor '{}' has {} dims; expected 1 to 4",
               path, ti.name, n_dims);
    // Every dim is below 2^40 and the product of the nonzero ones at most 2^62, so neither
    // numel() nor rows() overflows, even beside a zero dim.
    uint64_t numel = 1, span = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = c.get<uint64_t>("a tensor dim");
      FSDP_CHECK(n < (uint64_t(1) << 40) && span <= (uint64_t(1) << 62) / std::max<uint64_t>(n, 1),
                 "[gguf] {}: tensor '{}' has dim {} = {}, too large", path, ti.name, d, n);
      span *= std::max<uint64_t>(n, 1);
      numel *= n;
      ti.ne.push_back(int64_t(n));
    }
    ti.type = c.get<uint32_t>("a tensor type");
    auto [block, bytes] = ggml_block(ti.type);
    FSDP_CHECK(block > 0, "[gguf] {}: tensor '{}' has ggml type {}, which ggml does not have", path,
               ti.name, ti.type);
    FSDP_CHECK(ti.ne[0] % block == 0,
               "[gguf] {}: tensor '{}' is {} with rows of {} elements, not a multiple of its "
               "block of {}",
               path, ti.name, ggml_type_name(ti.type), ti.ne[0], block);
    ti.nbytes = numel / block * bytes;
    ti.offset = c.get<uint64_t>("a tensor offset");
    FSDP_CHECK(ti.offset % alignment_ == 0,
               "[gguf] {}: tensor '{}' has offset {}, not a multiple of the alignment {}", path,
               ti.name, ti.offset, alignment_);
    by_name_[ti.name] = tensors_.size();
    tensors_.push_back(std::move(ti));
  }
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  FSDP_CHECK(data_offset_ <= size_ || tensors_.empty(),
             "[gguf] {}: the data section would start at {} but the file has {} bytes (truncated?)",
             path, data_offset_, size_);
  const uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  for (const GgufTensorInfo& ti : tensors_)
    FSDP_CHECK(ti.offset <= data_size && ti.nbytes <= data_size - ti.offset,
               "[gguf] {}: tensor '{}' ({} {}) spans data bytes [{}, {}) but the data section has "
               "{} (truncated?)",
               path, ti.name, ggml_type_name(ti.type), shape_str(ti.shape()), ti.offset,
               ti.offset + ti.nbytes, data_size);
}

const GgufValue& GgufFile::at(const std::string& key) const {
  auto it = kv_.find(key);
  FSDP_CHECK(it != kv_.end(), "[gguf] {}: no metadata key '{}' ({} keys in the file)", path_, key,
             kv_.size());
  return it->second;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = at(key);
  FSDP_CHECK(v.is_integer(), "[gguf] {}: key '{}' is a {}, not an integer", path_, key,
             gguf_type_name(v.type));
  return v.integer;
}

int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = at(key);
  if (v.is_integer()) return double(v.integer);
  FSDP_CHECK(is_float(v.type), "[gguf] {}: key '{}' is a {}, not a number", path_, key,
             gguf_type_name(v.type));
  return v.real;
}

double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const GgufValue& v = at(key);
  FSDP_CHECK(v.type == GgufType::boolean, "[gguf] {}: key '{}' is a {}, not a bool", path_, key,
             gguf_type_name(v.type));
  return v.integer != 0;
}

const std::string& GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = at(key);
  FSDP_CHECK(v.type == GgufType::string, "[gguf] {}: key '{}' is a {}, not a string", path_, key,
             gguf_type_name(v.type));
  return v.str;
}

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

const std::vector<std::string>& GgufFile::get_strings(const std::string& key) const {
  const GgufValue& v = at(key);
  FSDP_CHECK(v.is_array() && v.array_type == GgufType::string,
             "[gguf] {}: key '{}' is a {}{}, not an array of strings", path_, key,
             gguf_type_name(v.type),
             v.is_array() ? fmt::format(" of {}", gguf_type_name(v.array_type)) : "");
  return v.strs;
}

const std::vector<int64_t>& GgufFile::get_ints(const std::string& key) const {
  const GgufValue& v = at(key);
  FSDP_CHECK(v.is_array() && v.array_type != GgufType::string && !is_float(v.array_type),
             "[gguf] {}: key '{}' is a {}{}, not an array of integers", path_, key,
             gguf_type_name(v.type),
             v.is_array() ? fmt::format(" of {}", gguf_type_name(v.array_type)) : "");
  return v.integers;
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  FSDP_CHECK(it != by_name_.end(), "[gguf] {}: no tensor named '{}' ({} tensors in the file)",
             path_, name, tensors_.size());
  return tensors_[it->second];
}

const uint8_t* GgufFile::tensor_data(const std::string& name) const {
  return map_.get() + data_offset_ + tensor(name).offset;
}

// ---------------------------------------------------------------- dequantization

void dequantize_row(uint32_t type, const uint8_t* src, float* dst, int64_t n) {
  FSDP_CHECK(ggml_type_readable(type),
             "[gguf] cannot dequantize {}: fsdp.cpp reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K "
             "and Q6_K",
             ggml_type_name(type));
  auto [block, bytes] = ggml_block(type);
  FSDP_CHECK(n >= 0 && n % block == 0, "[gguf] {} needs a multiple of {} elements, not {}",
             ggml_type_name(type), block, n);
  const int64_t nb = n / block;
  switch (GgmlType(type)) {
    case GgmlType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = half(src + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(bf16{load<uint16_t>(src + 2 * i)});
      return;
    case GgmlType::Q8_0:  // d (f16), 32 x int8: y = q * d
      for (int64_t b = 0; b < nb; ++b, src += bytes, dst += 32) {
        const float d = half(src);
        for (int j = 0; j < 32; ++j) dst[j] = float(int8_t(src[2 + j])) * d;
      }
      return;
    case GgmlType::Q4_0:  // d, 16 bytes: element j low nibble, j + 16 high; y = d * (q - 8)
      for (int64_t b = 0; b < nb; ++b, src += bytes, dst += 32) {
        const float d = half(src);
        const uint8_t* q = src + 2;
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * float(int(q[j] & 0xF) - 8);
          dst[j + 16] = d * float(int(q[j] >> 4) - 8);
        }
      }
      return;
    case GgmlType::Q4_1:  // d, m, 16 bytes as Q4_0; y = d * q + m
      for (int64_t b = 0; b < nb; ++b, src += bytes, dst += 32) {
        const float d = half(src), m = half(src + 2);
        const uint8_t* q = src + 4;
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * float(q[j] & 0xF) + m;
          dst[j + 16] = d * float(q[j] >> 4) + m;
        }
      }
      return;
    case GgmlType::Q4_K:
      // d, dmin, 12 bytes of eight 6-bit scales and mins, 128 bytes of nibbles. Sub-block s
      // (32 elements) has scale sc[s] and min m[s]; chunk c (64 elements) takes bytes
      // [32c, 32c + 32), sub-block 2c from the low nibbles, 2c + 1 from the high ones.
      // y = (d * sc) * q - dmin * m.
      for (int64_t b = 0; b < nb; ++b, src += bytes, dst += 256) {
        const float d = half(src), dmin = half(src + 2);
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
        const float d = half(src + 208);
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

// ---------------------------------------------------------------- rows

namespace {
// Architectures whose q/k llama.cpp's converter leaves in Hugging Face's order (their rope is
// NEOX-style in llama.cpp too).
const std::set<std::string> kNotPermuted = {"qwen2", "qwen3"};  // named in read_rows' error
}  // namespace

Tensor GgufFile::read_rows(const std::string& name, int64_t row_begin, int64_t row_end,
                           RowOrder order, DType dtype) const {
  const GgufTensorInfo& ti = tensor(name);
  FSDP_CHECK(dtype == DType::f32 || dtype == DType::f64,
             "[gguf] {}: tensor '{}' reads as f32 or f64, not {}", path_, name, dtype_name(dtype));
  FSDP_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= ti.rows(),
             "[gguf] {}: rows [{}, {}) of tensor '{}' are outside its {} rows", path_, row_begin,
             row_end, name, ti.rows());
  FSDP_CHECK(ggml_type_readable(ti.type),
             "[gguf] {}: tensor '{}' is {}; fsdp.cpp dequantizes F32, F16, BF16, Q8_0, Q4_0, "
             "Q4_1, Q4_K and Q6_K",
             path_, name, ggml_type_name(ti.type));
  // Hugging Face's order for q and k of llama: undo the permutation with the head count that
  // made it (n_head stays 0 where nothing was permuted).
  int64_t n_head = 0;
  const bool q = name.ends_with(".attn_q.weight"), k = name.ends_with(".attn_k.weight");
  if (order == RowOrder::hf && name.starts_with("blk.") && (q || k)) {
    const std::string& arch = get_string("general.architecture");
    FSDP_CHECK(arch == "llama" || kNotPermuted.count(arch),
               "[gguf] {}: general.architecture is '{}'; fsdp.cpp knows whether llama.cpp's "
               "converter permuted the q/k rows of llama (it did), qwen2 and qwen3 (it did not), "
               "so it cannot give tensor '{}' in Hugging Face's order",
               path_, arch, name);
    if (arch == "llama") {
      n_head = q ? get_int("llama.attention.head_count")
                 : get_int("llama.attention.head_count_kv", get_int("llama.attention.head_count"));
      FSDP_CHECK(ti.ne.size() == 2 && n_head > 0 && ti.rows() % (2 * n_head) == 0,
                 "[gguf] {}: tensor '{}' ({} rows) cannot be put in Hugging Face's order for {} "
                 "heads: it needs 2 dims and rows a multiple of 2 x heads",
                 path_, name, ti.rows(), n_head);
    }
  }
  const int64_t n = row_end - row_begin, cols = ti.ne[0];
  Tensor out = Tensor::empty({n, cols}, dtype);
  if (n == 0 || cols == 0) return out;  // no bytes to read (and no loop over empty rows)
  const uint8_t* base = map_.get() + data_offset_ + ti.offset;
  const uint64_t rb = ti.row_bytes();
  std::vector<float> tmp(dtype == DType::f64 ? size_t(cols) : 0);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t src_row =
        n_head ? gguf_row_of_hf(row_begin + r, ti.rows(), n_head) : row_begin + r;
    const uint8_t* src = base + uint64_t(src_row) * rb;
    if (dtype == DType::f32) {
      dequantize_row(ti.type, src, out.data<float>() + r * cols, cols);
    } else {
      dequantize_row(ti.type, src, tmp.data(), cols);
      double* y = out.data<double>() + r * cols;
      for (int64_t j = 0; j < cols; ++j) y[j] = tmp[size_t(j)];
    }
  }
  return out;
}

Tensor GgufFile::read(const std::string& name, RowOrder order, DType dtype) const {
  const GgufTensorInfo& ti = tensor(name);
  return read_rows(name, 0, ti.rows(), order, dtype).view(ti.shape());
}

// ---------------------------------------------------------------- llama

GgufLlamaConfig gguf_llama_config(const GgufFile& f) {
  const std::string& arch = f.get_string("general.architecture");
  FSDP_CHECK(arch == "llama", "[gguf] {}: general.architecture is '{}'; expected llama", f.path(),
             arch);
  GgufLlamaConfig c;
  c.dim = f.get_int("llama.embedding_length");
  c.layers = f.get_int("llama.block_count");
  c.heads = f.get_int("llama.attention.head_count");
  c.kv_heads = f.get_int("llama.attention.head_count_kv", c.heads);
  c.ffn_hidden = f.get_int("llama.feed_forward_length");
  c.context = f.get_int("llama.context_length", 0);
  c.rope_theta = f.get_float("llama.rope.freq_base", 10000.0);
  c.norm_eps = f.get_float("llama.attention.layer_norm_rms_epsilon", 1e-5);
  FSDP_CHECK(c.dim > 0 && c.layers > 0 && c.heads > 0 && c.kv_heads > 0 && c.ffn_hidden > 0 &&
                 c.dim % c.heads == 0 && c.heads % c.kv_heads == 0 && (c.dim / c.heads) % 2 == 0,
             "[gguf] {}: llama sizes dim {}, layers {}, heads {}, kv heads {}, ffn {} are not a "
             "model (dim must split into an even head size, heads into kv-head groups)",
             f.path(), c.dim, c.layers, c.heads, c.kv_heads, c.ffn_hidden);
  c.head_dim = c.dim / c.heads;
  const int64_t rope_dim = f.get_int("llama.rope.dimension_count", c.head_dim);
  FSDP_CHECK(rope_dim == c.head_dim,
             "[gguf] {}: llama.rope.dimension_count is {} but heads are {} wide; rope over part "
             "of a head is not supported",
             f.path(), rope_dim, c.head_dim);
  const std::string scaling = f.get_string("llama.rope.scaling.type", "none");
  FSDP_CHECK(scaling == "none", "[gguf] {}: llama.rope.scaling.type '{}' is not supported",
             f.path(), scaling);
  const GgufTensorInfo& embd = f.tensor("token_embd.weight");
  c.vocab = f.has("llama.vocab_size") ? f.get_int("llama.vocab_size")
            : f.has("tokenizer.ggml.tokens")
                ? int64_t(f.get_strings("tokenizer.ggml.tokens").size())
                : (embd.ne.size() == 2 ? embd.ne[1] : 0);
  FSDP_CHECK(embd.ne == std::vector<int64_t>({c.dim, c.vocab}),
             "[gguf] {}: token_embd.weight has ne {} but dim {} and vocab {} need [{}, {}]",
             f.path(), shape_str(embd.ne), c.dim, c.vocab, c.dim, c.vocab);
  c.tied = !f.contains("output.weight");
  return c;
}

std::string hf_name_of_gguf(const std::string& name) {
  static const std::map<std::string, std::string> top = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string> block = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  if (auto it = top.find(name); it != top.end()) return it->second;
  if (!name.starts_with("blk.")) return "";
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos || dot == 4) return "";
  const std::string layer = name.substr(4, dot - 4);
  if (!std::all_of(layer.begin(), layer.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    return "";
  auto it = block.find(name.substr(dot + 1));
  return it == block.end() ? "" : "model.layers." + layer + "." + it->second;
}

// ---------------------------------------------------------------- tokenizer

GgufTokenizerInfo gguf_tokenizer_info(const GgufFile& f) {
  GgufTokenizerInfo info;
  info.model = f.get_string("tokenizer.ggml.model");
  FSDP_CHECK(info.model == "gpt2",
             "[gguf] {}: tokenizer.ggml.model is '{}'; fsdp.cpp reads \"gpt2\" (byte-level BPE)",
             f.path(), info.model);
  info.pre = f.get_string("tokenizer.ggml.pre", "default");  // llama.cpp's name when absent
  info.chat_template = f.get_string("tokenizer.chat_template", "");
  const auto& tokens = f.get_strings("tokenizer.ggml.tokens");
  FSDP_CHECK(!tokens.empty() && tokens.size() < (size_t(1) << 31),
             "[gguf] {}: tokenizer.ggml.tokens has {} tokens", f.path(), tokens.size());
  std::vector<int64_t> types(tokens.size(), 1);
  if (f.has("tokenizer.ggml.token_type")) {
    types = f.get_ints("tokenizer.ggml.token_type");
    FSDP_CHECK(types.size() == tokens.size(),
               "[gguf] {}: tokenizer.ggml.token_type has {} entries for {} tokens", f.path(),
               types.size(), tokens.size());
  }
  auto id = [&](const char* key) -> std::optional<int32_t> {
    if (!f.has(key)) return std::nullopt;
    const int64_t v = f.get_int(key);
    FSDP_CHECK(v >= 0 && v < int64_t(tokens.size()),
               "[gguf] {}: {} is {}, outside the vocabulary [0, {})", f.path(), key, v,
               tokens.size());
    return int32_t(v);
  };
  info.bos = id("tokenizer.ggml.bos_token_id");
  info.eos = id("tokenizer.ggml.eos_token_id");
  info.pad = id("tokenizer.ggml.padding_token_id");
  info.unk = id("tokenizer.ggml.unknown_token_id");
  info.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", false);
  info.add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);

  // nlohmann::json's sorted maps, not ordered_json (whose lookups are linear, too slow for 50k
  // tokens): tokenizer.json readers take the ids from the values, not from the order.
  using json = nlohmann::json;
  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto [it, fresh] = vocab.emplace(tokens[i], int64_t(i));
    FSDP_CHECK(fresh, "[gguf] {}: token '{}' appears twice (ids {} and {})", f.path(), tokens[i],
               it->get<int64_t>(), i);
    enum : int64_t { CONTROL = 3, USER_DEFINED = 4 };
    if (types[i] == CONTROL || types[i] == USER_DEFINED)
      added.push_back({{"id", int64_t(i)},
                       {"content", tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", types[i] == USER_DEFINED},
                       {"special", types[i] == CONTROL}});
  }
  json merges = json::array();
  if (f.has("tokenizer.ggml.merges"))
    for (const std::string& m : f.get_strings("tokenizer.ggml.merges")) {
      const size_t sp = m.find(' ');
      FSDP_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < m.size(),
                 "[gguf] {}: merge '{}' is not \"a b\"", f.path(), m);
      merges.push_back(json::array({m.substr(0, sp), m.substr(sp + 1)}));
    }
  // llama.cpp's pre-tokenizer names: "gpt-2" is GPT-2's split alone; "smollm", "starcoder" and
  // "refact" split every number code point off first (Hugging Face: Digits(individual_digits)
  // then ByteLevel). Others use other regexes, which our tokenizer does not have.
  const bool digits = info.pre == "smollm" || info.pre == "starcoder" || info.pre == "refact";
  FSDP_CHECK(digits || info.pre == "gpt-2" || info.pre == "gpt2",
             "[gguf] {}: tokenizer.ggml.pre is '{}'; fsdp.cpp splits text as \"gpt-2\", "
             "\"smollm\", \"starcoder\" and \"refact\" do",
             f.path(), info.pre);
  const json byte_level = {
      {"type", "ByteLevel"},
      {"add_prefix_space", f.get_bool("tokenizer.ggml.add_space_prefix", false)},
      {"trim_offsets", true},
      {"use_regex", true}};
  const json pre =
      digits
          ? json{{"type", "Sequence"},
                 {"pretokenizers",
                  json::array({json{{"type", "Digits"}, {"individual_digits", true}}, byte_level})}}
          : byte_level;
  const json j = {{"version", "1.0"},
                  {"truncation", nullptr},
                  {"padding", nullptr},
                  {"added_tokens", added},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", pre},
                  {"post_processor", nullptr},
                  {"decoder", byte_level},
                  {"model",
                   {{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", nullptr},
                    {"continuing_subword_prefix", nullptr},
                    {"end_of_word_suffix", nullptr},
                    {"fuse_unk", false},
                    {"byte_fallback", false},
                    {"ignore_merges", false},
                    {"vocab", vocab},
                    {"merges", merges}}}};
  try {
    info.tokenizer_json = j.dump();
  } catch (const json::exception& e) {  // a token or merge that is not UTF-8
    FSDP_FAIL("[gguf] {}: the tokenizer's tokens and merges must be valid UTF-8: {}", f.path(),
              e.what());
  }
  return info;
}

data::Tokenizer gguf_tokenizer(const GgufFile& f) {
  return data::Tokenizer::from_json(gguf_tokenizer_info(f).tokenizer_json, f.path());
}

}  // namespace fsdp::checkpoint
