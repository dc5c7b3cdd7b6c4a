// safetensors reader and writer (nlohmann-json for the header).
#include "fsdp/checkpoint/safetensors.h"


#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "fsdp/core/file.h"
#include "src/core/json_read.h"

namespace fsdp::checkpoint {

namespace {

std::string st_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
  }
  return "?";
}

DType parse_st_dtype(const std::string& s, const std::string& path, const std::string& name) {
  if (s == "F32") return DType::f32;
  if (s == "F64") return DType::f64;
  if (s == "BF16") return DType::bf16;
  if (s == "F16") return DType::f16;
  if (s == "I32") return DType::i32;
  if (s == "I64") return DType::i64;
  FSDP_FAIL(
      "[safetensors] {}: tensor '{}' has dtype '{}'; supported: F32, F64, BF16, F16, I32, I64",
      path, name, s);
}

}  // namespace

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (auto& [n, t] : tensors)
    if (n == name) return t;
  FSDP_FAIL("[safetensors] {}: no tensor named '{}' ({} tensors in the file)", path, name,
            tensors.size());
}

bool SafetensorsFile::contains(const std::string& name) const {
  for (auto& [n, t] : tensors)
    if (n == name) return true;
  return false;
}

SafetensorsIndex::SafetensorsIndex(const std::string& path) : path_(path) {
  check_regular(path, "[safetensors]");
  std::ifstream f(path, std::ios::binary);
  FSDP_CHECK(f.good(), "[safetensors] cannot open '{}': {}", path, std::strerror(errno));
  f.seekg(0, std::ios::end);
  const uint64_t fsize = uint64_t(f.tellg());
  f.seekg(0);
  FSDP_CHECK(fsize >= 8,
             "[safetensors] {}: file is {} bytes, too short for the 8-byte header length", path,
             fsize);
  uint64_t hlen = 0;
  f.read(reinterpret_cast<char*>(&hlen), 8);
  FSDP_CHECK(hlen <= fsize - 8 && hlen < (uint64_t(1) << 30),
             "[safetensors] {}: header length {} does not fit in a {}-byte file (truncated or not "
             "safetensors)",
             path, hlen, fsize);
  std::string header(hlen, '\0');
  f.read(header.data(), std::streamsize(hlen));
  const nlohmann::json j =
      json_read::parse(header, path + " (its header)", "[safetensors]", uint64_t(1) << 30);
  FSDP_CHECK(j.is_object(), "[safetensors] {}: header must be a JSON object", path);
  data_start_ = 8 + hlen;
  const uint64_t data_size = fsize - data_start_;
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      for (auto& [k, mv] : v.items())
        metadata_[k] = mv.is_string() ? mv.get<std::string>() : mv.dump();
      continue;
    }
    FSDP_CHECK(
        v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
        "[safetensors] {}: entry '{}' lacks dtype, shape or data_offsets", path, name);
    // Every field of the right JSON type before it is read, and the shape's size computed
    // without overflow: the header comes from outside.
    const auto& dt = v["dtype"];
    const auto& sh = v["shape"];
    const auto& off = v["data_offsets"];
    FSDP_CHECK(dt.is_string() && sh.is_array() && off.is_array() && off.size() == 2 &&
                   off[0].is_number_unsigned() && off[1].is_number_unsigned(),
               "[safetensors] {}: entry '{}' must have a string dtype, a shape array and two "
               "unsigned data_offsets",
               path, name);
    Entry e{parse_st_dtype(dt.get<std::string>(), path, name),
            {},
            off[0].get<uint64_t>(),
            off[1].get<uint64_t>()};
    uint64_t numel = 1;
    for (const auto& d : sh) {
      FSDP_CHECK(d.is_number_unsigned() && d.get<uint64_t>() < (uint64_t(1) << 40),
                 "[safetensors] {}: tensor '{}' has a shape entry {} that is not a size", path,
                 name, d.dump());
      const uint64_t n = d.get<uint64_t>();
      FSDP_CHECK(n == 0 || numel <= data_size / n,
                 "[safetensors] {}: tensor '{}' has shape {} larger than the file", path, name,
                 sh.dump());
      numel *= n;
      e.shape.push_back(int64_t(n));
    }
    const uint64_t want = numel * dtype_size(e.dtype);
    FSDP_CHECK(e.begin <= e.end && e.end <= data_size,
               "[safetensors] {}: tensor '{}' spans bytes [{}, {}) but the data section has {} "
               "bytes (truncated?)",
               path, name, e.begin, e.end, data_size);
    FSDP_CHECK(e.end - e.begin == want,
               "[safetensors] {}: tensor '{}' has {} bytes but shape {} of {} needs {}", path, name,
               e.end - e.begin, shape_str(e.shape), dtype_name(e.dtype), want);
    entries_[name] = e;
  }
}

std::vector<std::string> SafetensorsIndex::names() const {
  std::vector<std::pair<uint64_t, std::string>> order;
  for (auto& [n, e] : entries_) order.emplace_back(e.begin, n);
  std::sort(order.begin(), order.end());
  std::vector<std::string> out;
  for (auto& [b, n] : order) out.push_back(n);
  return out;
}

std::tuple<DType, Shape, uint64_t> SafetensorsIndex::locate(const std::string& name) const {
  auto it = entries_.find(name);
  FSDP_CHECK(it != entries_.end(), "[safetensors] {}: no tensor named '{}'", path_, name);
  return {it->second.dtype, it->second.shape, data_start_ + it->second.begin};
}

Tensor SafetensorsIndex::read(const std::string& name) const {
  auto it = entries_.find(name);
  FSDP_CHECK(it != entries_.end(), "[safetensors] {}: no tensor named '{}'", path_, name);
  const Entry& e = it->second;
  Tensor t = Tensor::empty(e.shape, e.dtype);
  std::ifstream f(path_, std::ios::binary);
  f.seekg(std::streamoff(data_start_ + e.begin));
  f.read(static_cast<char*>(t.raw_data()), std::streamsize(e.end - e.begin));
  FSDP_CHECK(f.good() || e.end == e.begin, "[safetensors] {}: short read of tensor '{}'", path_,
             name);
  return t;
}

SafetensorsFile load_safetensors(const std::string& path) {
  SafetensorsIndex index(path);
  SafetensorsFile out;
  out.path = path;
  out.metadata = index.metadata();
  for (const std::string& n : index.names()) out.tensors.emplace_back(n, index.read(n));
  return out;
}

SafetensorsFile map_safetensors(const std::string& path) {
  SafetensorsIndex index(path);  // validates every offset first
  uint64_t size = 0;
  // Writable copy-on-write pages: a caller may convert a tensor in place; the file never changes.
  std::shared_ptr<uint8_t> map = map_file(path, "[safetensors]", &size, /*writable=*/true);
  std::shared_ptr<void> mapping(map, map.get());
  uint8_t* base = map.get();
  SafetensorsFile out;
  out.path = path;
  out.metadata = index.metadata();
  for (const std::string& n : index.names()) {
    auto [dtype, shape, offset] = index.locate(n);
    FSDP_CHECK(offset + uint64_t(shape_numel(shape)) * dtype_size(dtype) <= size,
               "[safetensors] '{}' changed between its header's check and its mapping (now {} "
               "bytes, tensor '{}' ends past it)",
               path, size, n);
    out.tensors.emplace_back(
        n, Tensor::from_blob(base + offset, shape, dtype, mapping));
  }
  return out;
}

std::string file_checksum(const std::string& path) {
  check_regular(path, "[checkpoint]");
  std::ifstream f(path, std::ios::binary);
  FSDP_CHECK(f.good(), "[checkpoint] cannot read '{}': {}", path, std::strerror(errno));
  uint64_t h = 0xcbf29ce484222325ull;
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    for (std::streamsize i = 0; i < f.gcount(); ++i) {
      h ^= static_cast<unsigned char>(buf[size_t(i)]);
      h *= 0x100000001b3ull;
    }
  }
  return fmt::format("{:016x}", h);
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t off = 0;
  std::vector<Tensor> host;
  for (auto& [name, t] : tensors) {
    FSDP_CHECK(name != "__metadata__" && !j.contains(name),
               "[safetensors] duplicate or reserved tensor name '{}'", name);
    Tensor h = t.to(Device::cpu()).contiguous();
    j[name] = {{"dtype", st_dtype(h.dtype())},
               {"shape", h.shape()},
               {"data_offsets", {off, off + h.nbytes()}}};
    off += h.nbytes();
    host.push_back(h);
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  AtomicFile f(path, "[safetensors]");  // removed on any error: no partial file, no stray .tmp
  uint64_t hlen = header.size();
  f.write(&hlen, 8);
  f.write(header.data(), header.size());
  for (const Tensor& h : host) f.write(h.raw_data(), h.nbytes());
  f.commit();
}

}  // namespace fsdp::checkpoint
