// A checkpoint's metadata.json from outside (a damaged or foreign checkpoint): consolidation
// (fsdp-export's reader, every field of the metadata) and the extra-file reader.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/interchange.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = fuzz::scratch() / "step_00000001";
  std::filesystem::create_directories(dir);
  fuzz::write_file("step_00000001/metadata.json", data, size);
  fsdp::nn::MiniLLMConfig cfg;
  fuzz::expect_clean("consolidate",
                     [&] { (void)fsdp::checkpoint::consolidate(dir.string(), &cfg); });
  fuzz::expect_clean("read_extra_file", [&] {
    (void)fsdp::checkpoint::read_extra_file(dir.string(), "tokenizer.json");
  });
  fuzz::expect_clean("latest", [&] { (void)fsdp::checkpoint::latest(fuzz::scratch().string()); });
  return 0;
}
