// Reading the launcher's environment (see launch_env.h). Only strings and numbers: nothing here
// opens a socket, so every refusal happens before any rank waits for another.
#include "fsdp/distributed/launch_env.h"

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <system_error>
#include <vector>

#include "fsdp/core/error.h"

namespace fsdp::dist {

namespace {

const char* env(const char* k) {
  const char* v = std::getenv(k);
  return v && *v ? v : nullptr;
}

int64_t to_int(const char* name, const std::string& value) {
  int64_t v = 0;
  const char* b = value.data();
  const char* e = b + value.size();
  auto [p, ec] = std::from_chars(b, e, v);
  FSDP_CHECK(ec == std::errc() && p == e, "[init_process_group] {}='{}' is not an integer", name,
             value);
  return v;
}

int env_int(const char* name) {
  const char* v = env(name);
  FSDP_CHECK(v, "[init_process_group] {} is not set", name);
  const int64_t x = to_int(name, v);
  FSDP_CHECK(x >= -1 && x < (int64_t(1) << 31), "[init_process_group] {}={} is out of range", name,
             x);
  return int(x);
}

// Splits at commas outside brackets.
std::vector<std::string> split_top(const std::string& s, const std::string& whole) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    FSDP_CHECK(depth >= 0 && depth <= 1, "[init_process_group] malformed Slurm host list '{}'",
               whole);
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  FSDP_CHECK(depth == 0, "[init_process_group] malformed Slurm host list '{}'", whole);
  parts.push_back(cur);
  return parts;
}

void expand_name(const std::string& name, const std::string& whole, std::vector<std::string>& out) {
  const size_t open = name.find('[');
  if (open == std::string::npos) {
    FSDP_CHECK(!name.empty() && name.find(']') == std::string::npos,
               "[init_process_group] malformed Slurm host list '{}'", whole);
    out.push_back(name);
    return;
  }
  const size_t close = name.find(']', open);
  FSDP_CHECK(close != std::string::npos, "[init_process_group] malformed Slurm host list '{}'",
             whole);
  const std::string prefix = name.substr(0, open), rest = name.substr(close + 1),
                    ranges = name.substr(open + 1, close - open - 1);
  size_t start = 0;
  while (start <= ranges.size()) {
    size_t comma = ranges.find(',', start);
    if (comma == std::string::npos) comma = ranges.size();
    const std::string r = ranges.substr(start, comma - start);
    const size_t dash = r.find('-');
    const std::string lo = r.substr(0, dash),
                      hi = dash == std::string::npos ? lo : r.substr(dash + 1);
    FSDP_CHECK(!lo.empty() && !hi.empty() &&
                   lo.find_first_not_of("0123456789") == std::string::npos &&
                   hi.find_first_not_of("0123456789") == std::string::npos && lo.size() < 10 &&
                   hi.size() < 10,
               "[init_process_group] malformed range '{}' in Slurm host list '{}'", r, whole);
    const int64_t a = to_int("SLURM node list", lo), b = to_int("SLURM node list", hi);
    FSDP_CHECK(a <= b && b - a < 100000,
               "[init_process_group] range '{}' in Slurm host list '{}' is empty or too long", r,
               whole);
    for (int64_t i = a; i <= b; ++i) {
      std::string num = std::to_string(i);
      if (num.size() < lo.size()) num.insert(0, lo.size() - num.size(), '0');
      expand_name(prefix + num + rest, whole, out);
    }
    start = comma + 1;
  }
}

// The step's size and this task's place in it, from Slurm's variables.
LaunchEnv slurm_env() {
  LaunchEnv e;
  e.launcher = "slurm";
  e.rank = env_int("SLURM_PROCID");
  e.size = env("SLURM_STEP_NUM_TASKS") ? env_int("SLURM_STEP_NUM_TASKS") : env_int("SLURM_NTASKS");
  e.local_rank = env("SLURM_LOCALID") ? env_int("SLURM_LOCALID") : 0;
  e.local_size = e.size;
  const int node = env("SLURM_NODEID") ? env_int("SLURM_NODEID") : 0;
  for (const char* k : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (!env(k)) continue;
    const std::vector<int> per = expand_slurm_tasks_per_node(env(k));
    FSDP_CHECK(node >= 0 && size_t(node) < per.size(),
               "[init_process_group] SLURM_NODEID={} but {}='{}' names {} node(s)", node, k, env(k),
               per.size());
    e.local_size = per[size_t(node)];
    break;
  }
  if (e.local_size == e.size && env("SLURM_NTASKS_PER_NODE"))
    e.local_size = env_int("SLURM_NTASKS_PER_NODE");
  e.pmix = env("PMIX_RANK") != nullptr;
  if (e.size <= 1) return e;
  const char* job = env("SLURM_JOB_ID");
  const char* step = env("SLURM_STEP_ID");
  if (job) e.run_id = std::string(job) + "." + (step ? step : "0");
  if (e.pmix) return e;  // MPI meets through PMIx; no store is needed
  if (const char* a = env("MASTER_ADDR")) {
    e.master_addr = a;
  } else {
    const char* list = env("SLURM_STEP_NODELIST")  ? env("SLURM_STEP_NODELIST")
                       : env("SLURM_JOB_NODELIST") ? env("SLURM_JOB_NODELIST")
                                                   : env("SLURM_NODELIST");
    FSDP_CHECK(list,
               "[init_process_group] a Slurm step of {} tasks (SLURM_PROCID={}, "
               "SLURM_STEP_NUM_TASKS/SLURM_NTASKS={}) but no SLURM_STEP_NODELIST, "
               "SLURM_JOB_NODELIST or MASTER_ADDR says where the ranks meet; launch with srun "
               "inside an allocation, or set MASTER_ADDR and MASTER_PORT",
               e.size, e.rank, e.size);
    e.master_addr = expand_slurm_nodelist(list).front();
  }
  if (env("MASTER_PORT")) {
    e.master_port = env_int("MASTER_PORT");
  } else {
    FSDP_CHECK(job,
               "[init_process_group] a Slurm step of {} tasks with neither MASTER_PORT nor "
               "SLURM_JOB_ID to choose the rendezvous port from",
               e.size);
    // Below the usual ephemeral range (32768 and up), one port per job step.
    const int64_t j = to_int("SLURM_JOB_ID", job), s = step ? to_int("SLURM_STEP_ID", step) : 0;
    e.master_port = int(15000 + (j * 10 + s) % 15000);
  }
  return e;
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list) {
  FSDP_CHECK(!list.empty(), "[init_process_group] an empty Slurm host list");
  std::vector<std::string> out;
  for (const std::string& part : split_top(list, list)) expand_name(part, list, out);
  return out;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& s) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    const std::string item = s.substr(start, comma - start);
    const size_t x = item.find("(x");
    const int64_t n = to_int("SLURM_TASKS_PER_NODE", item.substr(0, x));
    int64_t times = 1;
    if (x != std::string::npos) {
      FSDP_CHECK(item.back() == ')', "[init_process_group] malformed tasks per node '{}'", s);
      times = to_int("SLURM_TASKS_PER_NODE", item.substr(x + 2, item.size() - x - 3));
    }
    FSDP_CHECK(n >= 1 && times >= 1 && times <= 100000,
               "[init_process_group] malformed tasks per node '{}'", s);
    out.insert(out.end(), size_t(times), int(n));
    start = comma + 1;
  }
  return out;
}

LaunchEnv read_launch_env() {
  LaunchEnv e;
  if (env("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = "mpirun";
    e.rank = env_int("OMPI_COMM_WORLD_RANK");
    e.size = env_int("OMPI_COMM_WORLD_SIZE");
    if (env("OMPI_COMM_WORLD_LOCAL_RANK")) e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK");
    if (env("OMPI_COMM_WORLD_LOCAL_SIZE")) e.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
  } else if (env("RANK") || env("WORLD_SIZE")) {
    e.launcher = "torchrun";
    for (const char* k : {"RANK", "WORLD_SIZE"})
      FSDP_CHECK(env(k),
                 "[init_process_group] {} is not set (torchrun-style launch needs RANK, "
                 "WORLD_SIZE, MASTER_ADDR and MASTER_PORT)",
                 k);
    e.rank = env_int("RANK");
    e.size = env_int("WORLD_SIZE");
    e.local_rank = env("LOCAL_RANK") ? env_int("LOCAL_RANK") : e.rank;
    e.local_size = env("LOCAL_WORLD_SIZE") ? env_int("LOCAL_WORLD_SIZE") : e.size;
    if (const char* a = env("MASTER_ADDR")) e.master_addr = a;
    if (env("MASTER_PORT")) e.master_port = env_int("MASTER_PORT");
    if (const char* id = env("TORCHELASTIC_RUN_ID")) e.run_id = id;
  } else if (env("SLURM_PROCID") && (env("SLURM_STEP_NUM_TASKS") || env("SLURM_NTASKS"))) {
    e = slurm_env();
  } else if (env("PMI_SIZE") || env("PMIX_SIZE")) {
    const char* k = env("PMI_SIZE") ? "PMI_SIZE" : "PMIX_SIZE";
    FSDP_CHECK(env_int(k) <= 1,
               "[init_process_group] {}={} names a world of several ranks from a PMI launcher "
               "(MPICH's or Intel MPI's mpiexec, or a PMIx server), which this build does not "
               "join: its MPI is Open MPI. Launch with Open MPI's mpirun, srun, or torchrun-style "
               "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)",
               k, env(k));
  }
  // The launcher's own names for the rank and the world size, in the messages.
  const char *rank_var = "RANK", *size_var = "WORLD_SIZE";
  if (e.launcher == "mpirun") rank_var = "OMPI_COMM_WORLD_RANK", size_var = "OMPI_COMM_WORLD_SIZE";
  if (e.launcher == "slurm") rank_var = "SLURM_PROCID", size_var = "SLURM_NTASKS";
  FSDP_CHECK(e.size >= 1, "[init_process_group] {} must be >= 1, got {}", size_var, e.size);
  FSDP_CHECK(e.rank >= 0 && e.rank < e.size, "[init_process_group] {}={} is not in [0, {}={})",
             rank_var, e.rank, size_var, e.size);
  FSDP_CHECK(e.local_rank >= 0 && e.local_size >= 1,
             "[init_process_group] local rank {} of {} ({} launch)", e.local_rank, e.local_size,
             e.launcher);
  return e;
}

}  // namespace fsdp::dist
