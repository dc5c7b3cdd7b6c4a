// safetensors files from outside: the parser, the header index and the memory mapping.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "fsdp/checkpoint/safetensors.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("in.safetensors", data, size);
  fuzz::expect_clean("load_safetensors", [&] {
    auto f = fsdp::checkpoint::load_safetensors(path);
    for (auto& [name, t] : f.tensors) (void)t.to_f64_vector();
  });
  fuzz::expect_clean("SafetensorsIndex", [&] {
    fsdp::checkpoint::SafetensorsIndex index(path);
    for (const auto& name : index.names()) (void)index.read(name);
  });
  fuzz::expect_clean("map_safetensors", [&] { (void)fsdp::checkpoint::map_safetensors(path); });
  return 0;
}
