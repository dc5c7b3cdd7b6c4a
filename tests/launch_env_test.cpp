// The launcher's environment as init_process_group reads it (launch_env.h): Slurm's node and
// task lists, each launcher's variables, which one wins, and the worlds of several ranks with no
// way to meet, refused by name. Each test sets the variables it needs and clears the rest.
#include "fsdp/distributed/launch_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"

using namespace fsdp;
using namespace fsdp::dist;

namespace {

const char* kVars[] = {"OMPI_COMM_WORLD_RANK",
                       "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK",
                       "OMPI_COMM_WORLD_LOCAL_SIZE",
                       "RANK",
                       "WORLD_SIZE",
                       "LOCAL_RANK",
                       "LOCAL_WORLD_SIZE",
                       "MASTER_ADDR",
                       "MASTER_PORT",
                       "TORCHELASTIC_RUN_ID",
                       "SLURM_PROCID",
                       "SLURM_NTASKS",
                       "SLURM_STEP_NUM_TASKS",
                       "SLURM_LOCALID",
                       "SLURM_NODEID",
                       "SLURM_STEP_TASKS_PER_NODE",
                       "SLURM_TASKS_PER_NODE",
                       "SLURM_NTASKS_PER_NODE",
                       "SLURM_STEP_NODELIST",
                       "SLURM_JOB_NODELIST",
                       "SLURM_NODELIST",
                       "SLURM_JOB_ID",
                       "SLURM_STEP_ID",
                       "PMIX_RANK",
                       "PMI_RANK",
                       "PMI_SIZE",
                       "PMIX_SIZE"};

// Clears every launcher variable, then sets `vars`.
void launch(const std::vector<std::pair<const char*, const char*>>& vars) {
  for (const char* k : kVars) unsetenv(k);
  for (const auto& [k, v] : vars) setenv(k, v, 1);
}

std::string refusal() {
  try {
    read_launch_env();
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST(LaunchEnv, NodeLists) {
  EXPECT_EQ(expand_slurm_nodelist("node[01-03,07],gpu-a"),
            (std::vector<std::string>{"node01", "node02", "node03", "node07", "gpu-a"}));
  EXPECT_EQ(expand_slurm_nodelist("localhost"), std::vector<std::string>{"localhost"});
  EXPECT_EQ(expand_slurm_nodelist("r[1-2]n[08-09]"),
            (std::vector<std::string>{"r1n08", "r1n09", "r2n08", "r2n09"}));
  EXPECT_EQ(expand_slurm_nodelist("a[9-11]"), (std::vector<std::string>{"a9", "a10", "a11"}));
  for (const char* bad : {"node[01-", "node]", "node[3-1]", "node[a-b]", "node[[1]]", ""})
    EXPECT_THROW(expand_slurm_nodelist(bad), Error) << bad;
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("4"), std::vector<int>{4});
  for (const char* bad : {"2(x", "x", "0", "2(x0)"})
    EXPECT_THROW(expand_slurm_tasks_per_node(bad), Error) << bad;
}

TEST(LaunchEnv, SrunStep) {
  launch({{"SLURM_PROCID", "3"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_STEP_NUM_TASKS", "4"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_STEP_NODELIST", "gpu[07-08]"},
          {"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "1"}});
  const LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.run_id, "4242.1");
  EXPECT_EQ(e.master_port, 15000 + (4242 * 10 + 1) % 15000);
  EXPECT_FALSE(e.pmix);
  // MASTER_ADDR and MASTER_PORT, when set, say where the ranks meet.
  setenv("MASTER_ADDR", "10.0.0.5", 1);
  setenv("MASTER_PORT", "29400", 1);
  const LaunchEnv m = read_launch_env();
  EXPECT_EQ(m.master_addr, "10.0.0.5");
  EXPECT_EQ(m.master_port, 29400);
  // Under srun --mpi=pmix, MPI meets through PMIx.
  launch({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"PMIX_RANK", "0"}});
  EXPECT_TRUE(read_launch_env().pmix);
}

TEST(LaunchEnv, LaunchersInOrder) {
  // torchrun inside a Slurm allocation: torchrun's variables win.
  launch({{"RANK", "1"},
          {"WORLD_SIZE", "2"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "1"},
          {"TORCHELASTIC_RUN_ID", "r1"}});
  LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.run_id, "r1");
  launch({{"OMPI_COMM_WORLD_RANK", "0"},
          {"OMPI_COMM_WORLD_SIZE", "2"},
          {"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "2"}});
  EXPECT_EQ(read_launch_env().launcher, "mpirun");
  launch({});
  e = read_launch_env();
  EXPECT_EQ(e.launcher, "none");
  EXPECT_EQ(e.size, 1);
  // A batch script of one task is a world of one.
  launch({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_ID", "7"}});
  EXPECT_EQ(read_launch_env().size, 1);
}

TEST(LaunchEnv, NoWayToMeetIsRefusedByName) {
  launch({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  std::string why = refusal();
  EXPECT_NE(why.find("a Slurm step of 2 tasks"), std::string::npos) << why;
  EXPECT_NE(why.find("SLURM_STEP_NODELIST"), std::string::npos) << why;
  launch({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "n1"}});
  why = refusal();
  EXPECT_NE(why.find("neither MASTER_PORT nor SLURM_JOB_ID"), std::string::npos) << why;
  launch({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}});
  why = refusal();
  EXPECT_NE(why.find("PMI_SIZE=2"), std::string::npos) << why;
  launch({{"RANK", "0"}});
  why = refusal();
  EXPECT_NE(why.find("WORLD_SIZE is not set"), std::string::npos) << why;
  launch({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
  why = refusal();
  EXPECT_NE(why.find("RANK=2 is not in [0, WORLD_SIZE=2)"), std::string::npos) << why;
  launch({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}});
  why = refusal();
  EXPECT_NE(why.find("SLURM_PROCID='x' is not an integer"), std::string::npos) << why;
  launch({});
}
