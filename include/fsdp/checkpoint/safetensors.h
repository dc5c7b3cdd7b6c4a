// safetensors: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw
// bytes. Used for the PyTorch fixtures now and for import/export later.
// Loading validates every offset against the file size and names the file
// and tensor in any error. Saving writes a temporary file, fsyncs it and
// renames it over the target, so an existing file is never half-overwritten.
#pragma once

#include <map>
#include <string>
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
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace fsdp::checkpoint
