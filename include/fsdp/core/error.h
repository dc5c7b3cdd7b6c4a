// One error type and one family of check macros for the whole library.
// A message starts with where it came from, in brackets, and names the bad
// value: "[rmsnorm] weight has 255 elements but the last dim of x is 256".
// The library throws; only the binaries in examples/ catch, print and exit.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace fsdp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An fsdp::Error's message without the place in the source that FSDP_CHECK and FSDP_FAIL append
// ("... (at file.cpp:12)", "... (check `cond` failed at file.cpp:12)"): for a message shown to a
// user as their input's fault, or wrapped in another.
std::string_view without_source_place(std::string_view what);

namespace detail {
[[noreturn]] void fail(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace fsdp

// FSDP_CHECK(cond, "[op] fmt {}", args...): throws fsdp::Error with the
// message, then the failed expression and its place in the source.
#define FSDP_CHECK(cond, ...)                                                      \
  do {                                                                             \
    if (!(cond)) [[unlikely]]                                                      \
      ::fsdp::detail::fail(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

#define FSDP_FAIL(...) ::fsdp::detail::fail(nullptr, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__))
