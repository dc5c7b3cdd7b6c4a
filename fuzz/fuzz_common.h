// Shared by the libFuzzer targets: a private scratch directory, and the contract every reader
// of outside bytes keeps: bad input is an fsdp::Error (a message naming the value), never a
// crash, a hang, a sanitizer report or another exception.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "fsdp/core/error.h"

namespace fuzz {

inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    char tmpl[] = "/tmp/fsdp_fuzz_XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) std::abort();
    return std::filesystem::path(d);
  }();
  return dir;
}

inline std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  const auto path = scratch() / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  return path.string();
}

// Runs f; fsdp::Error is the expected refusal; anything else is a finding.
template <class F>
void expect_clean(const char* what, F&& f) {
  try {
    f();
  } catch (const fsdp::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: an exception that is not fsdp::Error: %s\n", what, e.what());
    std::abort();
  }
}

}  // namespace fuzz
