// The main() of a test binary that runs under a launcher with real ranks (dist_test,
// expert_parallel_test): GoogleTest between init_process_group and destroy_process_group, and a
// failure to meet or to leave named and turned into a non-zero exit.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

#include "fsdp/core/error.h"
#include "fsdp/distributed/init.h"

namespace fsdp::test {

inline int dist_test_main(int argc, char** argv, const char* name) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    dist::init_process_group();
  } catch (const Error& e) {
    fmt::print(stderr, "{}: error: {}\n", name, e.what());
    return 1;
  }
  const int rc = RUN_ALL_TESTS();
  try {
    dist::destroy_process_group();
  } catch (const Error& e) {
    fmt::print(stderr, "{}: error: {}\n", name, e.what());
    dist::abort_process(1);
  }
  return rc;
}

}  // namespace fsdp::test
