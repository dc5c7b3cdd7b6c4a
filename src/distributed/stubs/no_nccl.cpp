// NCCL in a build without it (no CUDA, or no nccl.h and libnccl at configure
// time): asking for it throws, naming what is missing.
#include <memory>

#include "fsdp/core/error.h"
#include "src/distributed/nccl/nccl_group.h"

namespace fsdp::dist {

std::shared_ptr<ProcessGroup> make_nccl_world(const WorldInfo& /*info*/, ProcessGroup& /*host*/) {
  FSDP_FAIL(
      "[init_process_group] backend nccl requested but fsdp.cpp was built without CUDA and NCCL "
      "(nccl.h and libnccl are found beside the CUDA toolkit at configure time)");
}

}  // namespace fsdp::dist
