// The ProcessGroup for CUDA tensors, on NCCL. Private; built with CUDA.
#pragma once

#include <memory>

#include "fsdp/dist/init.h"

namespace fsdp::dist {

// The world communicator. The unique id travels through the store
// (torchrun-style launch) or MPI (mpirun); a world of one makes its own.
std::shared_ptr<ProcessGroup> make_nccl_world(const WorldInfo& info,
                                              std::shared_ptr<TCPStore> store);

}  // namespace fsdp::dist
