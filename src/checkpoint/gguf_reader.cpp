// GGUF reader: a bounds-checked cursor over a read-only mapping, the file's key/values and
// tensor index, and rows of a tensor read through the dequantizers (ggml_quants.cpp). A family
// reads its metadata (its spec's read_gguf_config); the tokenizer is gguf_tokenizer.cpp's. See
// include/fsdp/checkpoint/gguf.h.
//
// Every read goes through Cursor, which refuses to step past the end of the file; every count
// read from the file is compared with the bytes left (each element takes at least one byte,
// or eight for a string's length) before a container is sized from it.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/models/spec.h"
#include "fsdp/models/state_dict_adapter.h"
#include "src/checkpoint/ggml_bytes.h"

namespace fsdp::checkpoint {

namespace {

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
    return ggml::load<T>(take(sizeof(T), what));
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

void GgufFile::release_pages() const { release_mapped_pages(map_.get(), size_); }

// ---------------------------------------------------------------- parsing

GgufFile::GgufFile(const std::string& path) : path_(path) {
  std::shared_ptr<uint8_t> map = map_file(path, "[gguf]", &size_);
  map_ = std::shared_ptr<const uint8_t>(map, map.get());

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

const std::vector<double>& GgufFile::get_floats(const std::string& key) const {
  const GgufValue& v = at(key);
  FSDP_CHECK(v.is_array() && is_float(v.array_type),
             "[gguf] {}: key '{}' is a {}{}, not an array of floats", path_, key,
             gguf_type_name(v.type),
             v.is_array() ? fmt::format(" of {}", gguf_type_name(v.array_type)) : "");
  return v.reals;
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

// ---------------------------------------------------------------- rows

// Hugging Face's order for q and k: the head count whose permutation to undo, or 0 where nothing
// was permuted. The family of the file's architecture says whether llama.cpp's converter permuted
// them (its state-dict adapter's gguf_half_split).
int64_t GgufFile::permuted_heads(const std::string& name, RowOrder order) const {
  const GgufTensorInfo& ti = tensor(name);
  const bool q = name.ends_with(".attn_q.weight"), k = name.ends_with(".attn_k.weight");
  if (order == RowOrder::hf && name.starts_with("blk.") && (q || k)) {
    const std::string& arch = get_string("general.architecture");
    const models::ModelSpec* spec = models::spec_for_gguf_arch(arch);
    FSDP_CHECK(spec,
               "[gguf] {}: general.architecture is '{}'; fsdp.cpp knows whether llama.cpp's "
               "converter permuted the q/k rows only of {}, so it cannot give tensor '{}' in "
               "Hugging Face's order",
               path_, arch, models::gguf_archs(), name);
    if (!spec->adapter->gguf_half_split) {
      const std::string a = arch + ".attention.";
      const int64_t n_head = q ? get_int(a + "head_count")
                               : get_int(a + "head_count_kv", get_int(a + "head_count"));
      FSDP_CHECK(ti.ne.size() == 2 && n_head > 0 && ti.rows() % (2 * n_head) == 0,
                 "[gguf] {}: tensor '{}' ({} rows) cannot be put in Hugging Face's order for {} "
                 "heads: it needs 2 dims and rows a multiple of 2 x heads",
                 path_, name, ti.rows(), n_head);
      return n_head;
    }
  }
  return 0;
}

Tensor GgufFile::read_rows(const std::string& name, int64_t row_begin, int64_t row_end,
                           RowOrder order, DType dtype) const {
  const GgufTensorInfo& ti = tensor(name);
  FSDP_CHECK(dtype == DType::f32 || dtype == DType::f64,
             "[gguf] {}: tensor '{}' reads as f32 or f64, not {}", path_, name, dtype_name(dtype));
  FSDP_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= ti.rows(),
             "[gguf] {}: rows [{}, {}) of tensor '{}' are outside its {} rows", path_, row_begin,
             row_end, name, ti.rows());
  FSDP_CHECK(ggml_type_readable(ti.type), "[gguf] {}: tensor '{}' is {}; fsdp.cpp dequantizes {}",
             path_, name, ggml_type_name(ti.type), ggml_readable_type_names());
  const int64_t n_head = permuted_heads(name, order);
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

void GgufFile::read_row_bytes(const std::string& name, int64_t row_begin, int64_t row_end,
                              RowOrder order, uint8_t* dst) const {
  const GgufTensorInfo& ti = tensor(name);
  FSDP_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= ti.rows(),
             "[gguf] {}: rows [{}, {}) of tensor '{}' are outside its {} rows", path_, row_begin,
             row_end, name, ti.rows());
  const int64_t n_head = permuted_heads(name, order);
  const uint8_t* base = map_.get() + data_offset_ + ti.offset;
  const uint64_t rb = ti.row_bytes();
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t src_row = n_head ? gguf_row_of_hf(r, ti.rows(), n_head) : r;
    std::memcpy(dst + uint64_t(r - row_begin) * rb, base + uint64_t(src_row) * rb, rb);
  }
}

Tensor GgufFile::read(const std::string& name, RowOrder order, DType dtype) const {
  const GgufTensorInfo& ti = tensor(name);
  return read_rows(name, 0, ti.rows(), order, dtype).view(ti.shape());
}

}  // namespace fsdp::checkpoint
