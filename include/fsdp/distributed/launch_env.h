// Where this process stands in the world, read from its launcher's environment:
//   mpirun          OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
//   torchrun-style  RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
//   Slurm (srun)    SLURM_PROCID, SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), SLURM_LOCALID,
//                   SLURM_NODEID with SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE,
//                   SLURM_NTASKS_PER_NODE), the rendezvous host the first node of
//                   SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST), unless MASTER_ADDR says
//                   otherwise; the port MASTER_PORT or one derived from SLURM_JOB_ID and
//                   SLURM_STEP_ID; the run id "JOB.STEP". Under srun --mpi=pmix (PMIX_RANK set)
//                   MPI initialises from the environment.
// The first launcher that matches, in that order, wins: torchrun or mpirun inside a Slurm
// allocation still see the allocation's SLURM_* variables. An environment that names a world of
// more than one with no way to meet (a Slurm step of N tasks without a node list, WORLD_SIZE
// without MASTER_ADDR, PMI_SIZE from an MPI this build cannot use) is an error that names the
// variables, never a silent world of one.
#pragma once

#include <string>
#include <vector>

namespace fsdp::dist {

struct LaunchEnv {
  std::string launcher = "none";  // "mpirun", "torchrun", "slurm" or "none"
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::string master_addr;  // torchrun-style and Slurm: where rank 0 serves the store
  int master_port = 0;
  std::string run_id;  // from the launcher when it names one ("" otherwise)
  bool pmix = false;   // srun --mpi=pmix: MPI can initialise from this environment
};

LaunchEnv read_launch_env();

// Slurm's compressed host lists: "node[01-03,07],gpu-a" -> node01 node02 node03 node07 gpu-a
// (zero padding kept; several bracket groups in one name multiply out). A malformed list is an
// error that quotes it.
std::vector<std::string> expand_slurm_nodelist(const std::string& list);
// Slurm's tasks per node: "2(x3),1" -> 2 2 2 1.
std::vector<int> expand_slurm_tasks_per_node(const std::string& s);

}  // namespace fsdp::dist
