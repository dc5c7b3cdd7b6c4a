// A chat template and a conversation from outside: the fuzzer's bytes split at the first NUL into
// a Jinja template and a JSON context (when it parses; else a fixed two-turn conversation). The
// engine must refuse bad templates and runaway renders as fsdp::Error (its sandbox's limits set
// low so that a run stays short), never crash, hang or trip a sanitizer.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/data/jinja.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const size_t cut = bytes.find('\0');
  const std::string source(bytes.substr(0, cut));
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(
      cut == std::string_view::npos ? std::string_view() : bytes.substr(cut + 1), nullptr, false);
  if (!ctx.is_object())
    ctx = nlohmann::ordered_json::parse(
        R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi {{ x }} <|im_end|>"},
            {"role": "assistant", "content": "Hello! ünï 🎉"}], "tools": null, "documents": null,
            "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  fsdp::data::jinja::Limits limits;
  limits.max_loop_iterations = 20000;
  limits.max_output_bytes = 1 << 20;
  limits.max_seconds = 2.0;
  fuzz::expect_clean("jinja::Template", [&] {
    const fsdp::data::jinja::Template t(source, "fuzz.jinja", limits);
    (void)t.render(ctx);
  });
  return 0;
}
