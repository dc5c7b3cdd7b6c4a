// init_process_group(): the world, from the launcher's environment (launch_env.h reads it):
//   mpirun          OMPI_COMM_WORLD_*                    -> mpi (CPU), nccl (CUDA; id over MPI)
//   torchrun-style  RANK WORLD_SIZE MASTER_ADDR ...      -> gloo (CPU), nccl (CUDA; id over the
//                                                           store)
//   Slurm (srun)    SLURM_PROCID SLURM_NTASKS, the node list
//                                                        -> gloo through a store on the first
//                                                           node; mpi under srun --mpi=pmix
//   no launcher     a world of one                       -> local (CPU), nccl (CUDA)
// FSDP_BACKEND overrides the choice. With a store, every rank meets at a TCPStore served by
// rank 0: an unreachable MASTER_ADDR, a port in use, a rank that never arrives or a world size
// that differs between ranks is an error naming the value within FSDP_STORE_TIMEOUT_S. An
// environment that names a world of several ranks with no way to meet is refused at once.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <string_view>

#include "fsdp/distributed/process_group.h"
#include "fsdp/distributed/store.h"

namespace fsdp::dist {

struct WorldInfo {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::string launcher = "none";  // "mpirun", "torchrun", "slurm" or "none"
  std::string backend;
  Device device;
};

struct InitOptions {
  Device device = Device::cpu();
  std::string backend;  // empty: FSDP_BACKEND, else from the launcher and the device
};

// Creates the world group once per process and returns it.
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& opt = {});
bool is_initialized();
std::shared_ptr<ProcessGroup> world();  // throws before init_process_group
const WorldInfo& world_info();
// The rendezvous store (torchrun-style launch only; nullptr otherwise).
std::shared_ptr<TCPStore> world_store();
// Waits for every rank, then releases the world (and finalises MPI).
void destroy_process_group();
// For binaries after an error: ends this process (and, under MPI, the job)
// without waiting on peers that may never answer.
[[noreturn]] void abort_process(int code);
// The same after printing "<program>: error: <what>" to stderr, exit code 1:
//   int main(int argc, char** argv) try { ... } catch (const std::exception& e) {
//     dist::abort_process(e, "my_trainer");
//   }
[[noreturn]] void abort_process(const std::exception& error, std::string_view program);

}  // namespace fsdp::dist
