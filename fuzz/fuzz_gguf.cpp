// GGUF files from outside: the header parser (metadata, tensor index), row reads in both orders
// (dequantizing every readable type), and the "gpt2" tokenizer built from the metadata.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <string>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp::checkpoint;
  const std::string path = fuzz::write_file("in.gguf", data, size);
  fuzz::expect_clean("GgufFile", [&] {
    const GgufFile f(path);
    for (const std::string& k : f.keys()) (void)f.at(k).array_size();
    for (const GgufTensorInfo& t : f.tensors()) {
      const int64_t rows = t.rows();
      // The first rows and the last, a few at most: a zero-width tensor may claim 2^62 rows.
      for (RowOrder order : {RowOrder::file, RowOrder::hf}) {
        fuzz::expect_clean(
            "read_rows", [&] { (void)f.read_rows(t.name, 0, std::min<int64_t>(rows, 4), order); });
        fuzz::expect_clean("read_rows", [&] {
          (void)f.read_rows(t.name, std::max<int64_t>(rows - 2, 0), rows, order, fsdp::DType::f64);
        });
      }
    }
    if (f.has("tokenizer.ggml.model")) {
      fuzz::expect_clean("gguf_tokenizer", [&] {
        const auto tok = gguf_tokenizer(f);
        (void)tok.decode(tok.encode("The license, “naïve” café 42 <|im_start|>"), true);
      });
    }
  });
  return 0;
}
