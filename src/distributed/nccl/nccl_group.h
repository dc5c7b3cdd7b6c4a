// The ProcessGroup for CUDA tensors, on NCCL. Private; src/distributed/stubs/no_nccl.cpp in builds without
// it.
#pragma once

#include <memory>

#include "fsdp/distributed/init.h"

namespace fsdp::dist {

// The world communicator on info.device. The unique id travels over the host engine (MPI,
// Gloo or local), which first checks that no two ranks share a GPU.
std::shared_ptr<ProcessGroup> make_nccl_world(const WorldInfo& info, ProcessGroup& host);

}  // namespace fsdp::dist
