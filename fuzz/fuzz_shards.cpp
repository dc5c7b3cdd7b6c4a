// llm.c token shards (.bin) from outside: the header, the token count, ids past the vocab.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "fsdp/data/token_sources.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("shard.bin", data, size);
  fuzz::expect_clean("open_token_stream", [&] {
    auto s = fsdp::data::open_token_stream(path, 50304, 8);
    for (int64_t step = 0; step < 3; ++step) (void)s->batch(step, 2, 0, 2, 8);
  });
  return 0;
}
