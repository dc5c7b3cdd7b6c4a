// Builds the message of fsdp::Error: the caller's text, then where it failed.
#include "fsdp/core/error.h"

namespace fsdp::detail {

void fail(const char* expr, const char* file, int line, const std::string& msg) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  if (expr) throw Error(fmt::format("{} (check `{}` failed at {}:{})", msg, expr, base, line));
  throw Error(fmt::format("{} (at {}:{})", msg, base, line));
}

}  // namespace fsdp::detail
