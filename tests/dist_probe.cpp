// A minimal distributed program for the launch and rendezvous tests: it
// joins the world, optionally dies (FSDP_PROBE_DIE_RANK), all-reduces a
// tensor of ones and prints the result. Errors print and exit non-zero.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "fsdp/distributed/init.h"

int main() {
  using namespace fsdp;
  try {
    auto world = dist::init_process_group();
    world->barrier()->wait();  // everyone is connected before anyone dies on purpose
    const char* die = std::getenv("FSDP_PROBE_DIE_RANK");
    if (die && std::atoi(die) == world->rank()) {
      fmt::print("probe: rank {} dies on purpose\n", world->rank());
      std::fflush(stdout);
      _exit(3);
    }
    Tensor t = Tensor::full({16}, 1.0, DType::f32);
    world->all_reduce(t, dist::ReduceOp::SUM)->wait();
    fmt::print("probe ok: rank {} of {} ({}, launcher {}) sum {}\n", world->rank(), world->size(),
               world->backend(), dist::world_info().launcher, t.to_f64_vector()[0]);
    dist::destroy_process_group();
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "probe: error: {}\n", e.what());
    dist::abort_process(1);
  }
}
