// safetensors reader and writer (nlohmann-json for the header).
#include "fsdp/checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace fsdp::checkpoint {

namespace {

std::string st_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
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
  FSDP_FAIL("[safetensors] {}: tensor '{}' has dtype '{}'; supported: F32, F64, BF16, F16, I32, I64", path, name, s);
}

}  // namespace

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (auto& [n, t] : tensors)
    if (n == name) return t;
  FSDP_FAIL("[safetensors] {}: no tensor named '{}' ({} tensors in the file)", path, name, tensors.size());
}

bool SafetensorsFile::contains(const std::string& name) const {
  for (auto& [n, t] : tensors)
    if (n == name) return true;
  return false;
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  FSDP_CHECK(f.good(), "[safetensors] cannot open '{}': {}", path, std::strerror(errno));
  f.seekg(0, std::ios::end);
  const uint64_t fsize = uint64_t(f.tellg());
  f.seekg(0);
  FSDP_CHECK(fsize >= 8, "[safetensors] {}: file is {} bytes, too short for the 8-byte header length", path, fsize);
  uint64_t hlen = 0;
  f.read(reinterpret_cast<char*>(&hlen), 8);
  FSDP_CHECK(hlen <= fsize - 8 && hlen < (uint64_t(1) << 30),
             "[safetensors] {}: header length {} does not fit in a {}-byte file (truncated or not safetensors)", path,
             hlen, fsize);
  std::string header(hlen, '\0');
  f.read(header.data(), std::streamsize(hlen));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    FSDP_FAIL("[safetensors] {}: header is not valid JSON: {}", path, e.what());
  }
  FSDP_CHECK(j.is_object(), "[safetensors] {}: header must be a JSON object", path);
  const uint64_t data_start = 8 + hlen, data_size = fsize - data_start;

  SafetensorsFile out;
  out.path = path;
  std::vector<std::pair<uint64_t, std::string>> order;
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      for (auto& [k, mv] : v.items())
        out.metadata[k] = mv.is_string() ? mv.get<std::string>() : mv.dump();
      continue;
    }
    FSDP_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
               "[safetensors] {}: entry '{}' lacks dtype, shape or data_offsets", path, name);
    order.emplace_back(v["data_offsets"][0].get<uint64_t>(), name);
  }
  std::sort(order.begin(), order.end());
  for (auto& [begin_off, name] : order) {
    const auto& v = j[name];
    DType dt = parse_st_dtype(v["dtype"].get<std::string>(), path, name);
    Shape shape = v["shape"].get<Shape>();
    const uint64_t b = v["data_offsets"][0].get<uint64_t>(), e = v["data_offsets"][1].get<uint64_t>();
    const uint64_t want = uint64_t(shape_numel(shape)) * dtype_size(dt);
    FSDP_CHECK(b <= e && e <= data_size,
               "[safetensors] {}: tensor '{}' spans bytes [{}, {}) but the data section has {} bytes (truncated?)",
               path, name, b, e, data_size);
    FSDP_CHECK(e - b == want, "[safetensors] {}: tensor '{}' has {} bytes but shape {} of {} needs {}", path, name,
               e - b, shape_str(shape), dtype_name(dt), want);
    Tensor t = Tensor::empty(shape, dt);
    f.seekg(std::streamoff(data_start + b));
    f.read(static_cast<char*>(t.raw_data()), std::streamsize(want));
    FSDP_CHECK(f.good(), "[safetensors] {}: short read of tensor '{}'", path, name);
    out.tensors.emplace_back(name, t);
  }
  return out;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t off = 0;
  std::vector<Tensor> host;
  for (auto& [name, t] : tensors) {
    FSDP_CHECK(name != "__metadata__" && !j.contains(name), "[safetensors] duplicate or reserved tensor name '{}'",
               name);
    Tensor h = t.to(Device::cpu()).contiguous();
    j[name] = {{"dtype", st_dtype(h.dtype())}, {"shape", h.shape()}, {"data_offsets", {off, off + h.nbytes()}}};
    off += h.nbytes();
    host.push_back(h);
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  const std::string tmp = path + fmt::format(".tmp.{}", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  FSDP_CHECK(fd >= 0, "[safetensors] cannot create '{}': {}", tmp, std::strerror(errno));
  auto write_all = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n) {
      ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        FSDP_FAIL("[safetensors] writing '{}' failed: {}", tmp, std::strerror(err));
      }
      c += w;
      n -= size_t(w);
    }
  };
  uint64_t hlen = header.size();
  write_all(&hlen, 8);
  write_all(header.data(), header.size());
  for (const Tensor& h : host) write_all(h.raw_data(), h.nbytes());
  FSDP_CHECK(::fsync(fd) == 0, "[safetensors] fsync of '{}' failed: {}", tmp, std::strerror(errno));
  ::close(fd);
  FSDP_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "[safetensors] rename '{}' -> '{}' failed: {}", tmp, path,
             std::strerror(errno));
}

}  // namespace fsdp::checkpoint
