// A checkpoint's metadata.json from outside (a damaged or foreign checkpoint): consolidation
// (fsdp-export's reader, every field of the metadata) and the extra-file reader. The bytes are
// sealed (a complete.json holding their checksum) so that format-2 manifests reach the parser;
// format 1 is read without one.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = fuzz::scratch() / "step_00000001";
  std::filesystem::create_directories(dir);
  const std::string meta = fuzz::write_file("step_00000001/metadata.json", data, size);
  const std::string seal =
      "{\"metadata_checksum\": \"" + fsdp::checkpoint::file_checksum(meta) + "\"}";
  fuzz::write_file("step_00000001/complete.json", reinterpret_cast<const uint8_t*>(seal.data()),
                   seal.size());
  fsdp::nn::TransformerConfig cfg;
  fuzz::expect_clean("consolidate",
                     [&] { (void)fsdp::checkpoint::consolidate(dir.string(), &cfg); });
  fuzz::expect_clean("read_extra_file", [&] {
    (void)fsdp::checkpoint::read_extra_file(dir.string(), "tokenizer.json");
  });
  fuzz::expect_clean("latest", [&] { (void)fsdp::checkpoint::latest(fuzz::scratch().string()); });
  return 0;
}
