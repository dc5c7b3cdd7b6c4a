// safetensors: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw
// bytes. Used for the PyTorch fixtures now and for import/export later.
// Loading validates every offset against the file size and names the file
// and tensor in any error. Saving writes a temporary file, fsyncs it and
// renames it over the target, so an existing file is never half-overwritten.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fsdp/core/tensor.h"

namespace fsdp::checkpoint {

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order
  std::map<std::string, std::string> metadata;
  const Tensor& at(const std::string& name) const;  // throws naming the file's tensors when absent
  bool contains(const std::string& name) const;
  std::string path;
};

SafetensorsFile load_safetensors(const std::string& path);

// The header of a safetensors file, for reading single tensors without
// loading the rest (resharding reads only the rows it needs).
class SafetensorsIndex {
 public:
  explicit SafetensorsIndex(const std::string& path);
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  Tensor read(const std::string& name) const;  // throws naming the file when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::vector<std::string> names() const;  // in file order
  // dtype, shape and byte offset from the start of the file.
  std::tuple<DType, Shape, uint64_t> locate(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::string path_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Maps a safetensors file into memory: every tensor is a zero-copy view of
// the mapping (private and copy-on-write, so writes never reach the file), in
// the spirit of llama.cpp's and MLX's loaders. The mapping lives as long as
// any of its tensors.
SafetensorsFile map_safetensors(const std::string& path);

// FNV-1a 64 of a file's bytes, as 16 hex digits.
std::string file_checksum(const std::string& path);
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace fsdp::checkpoint
