// Builds the message of fsdp::Error: the caller's text, then where it failed.
#include "fsdp/core/error.h"

#include <algorithm>

namespace fsdp {

std::string_view without_source_place(std::string_view what) {
  return what.substr(0, std::min(what.rfind(" (at "), what.rfind(" (check `")));
}

}  // namespace fsdp

namespace fsdp::detail {

void fail(const char* expr, const char* file, int line, const std::string& msg) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  if (expr) throw Error(fmt::format("{} (check `{}` failed at {}:{})", msg, expr, base, line));
  throw Error(fmt::format("{} (at {}:{})", msg, base, line));
}

}  // namespace fsdp::detail
