// The MPI engine in a build without MPI (FSDP_MPI=OFF or no MPI found): asking
// for it throws, naming the option.
#include <memory>

#include "fsdp/core/error.h"
#include "src/distributed/transport.h"

namespace fsdp::dist {

std::unique_ptr<Transport> make_mpi_world_transport() {
  FSDP_FAIL(
      "[init_process_group] backend mpi requested but fsdp.cpp was built without MPI "
      "(FSDP_MPI=OFF, or no MPI found at configure time)");
}
void mpi_finalize() {}           // MPI was never initialised
void mpi_abort(int /*code*/) {}  // abort_process then exits the process itself

}  // namespace fsdp::dist
