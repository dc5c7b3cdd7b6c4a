// Rendezvous and the world group.
#include "fsdp/dist/init.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <compare>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "fsdp/core/env.h"
#include "src/dist/backend.h"
#include "src/dist/cpu_group.h"
#include "src/dist/device_host_group.h"
#include "src/dist/nccl/nccl_group.h"
#include "src/dist/watchdog.h"

namespace fsdp::dist {

namespace {

struct World {
  std::shared_ptr<ProcessGroup> group;
  std::shared_ptr<TCPStore> store;
  std::shared_ptr<TCPStore> board_store;  // mpirun: rank 0 serves one for the progress board
  WorldInfo info;
  bool mpi = false;
};
// Under mpirun there is no launcher store: rank 0 serves one on a free port for the progress
// board and tells the others where over the world group. The board is advice, so a store that
// cannot be made leaves the job without one rather than failing it.
std::shared_ptr<TCPStore> serve_board_store(ProcessGroup& world, const WorldInfo& info,
                                            std::chrono::milliseconds timeout) {
  std::shared_ptr<TCPStore> store;
  Tensor where = Tensor::zeros({256}, DType::i32);
  try {
    if (info.rank == 0) {
      char host[200] = "127.0.0.1";  // every rank on this machine: loopback
      if (info.local_size != info.size && ::gethostname(host, sizeof(host) - 1) != 0)
        std::strcpy(host, "127.0.0.1");
      store = std::make_shared<TCPStore>(host, 0, true, timeout);
      const std::string address = store->address();
      for (size_t i = 0; i < address.size() && i < 255; ++i)
        where.data<int32_t>()[i] = int32_t(static_cast<unsigned char>(address[i]));
    }
  } catch (const std::exception&) {
    store.reset();  // rank 0 sends an empty address: no board
  }
  world.broadcast(where, 0)->wait();
  std::string address;
  for (int i = 0; i < 256 && where.data<int32_t>()[i] != 0; ++i)
    address.push_back(char(where.data<int32_t>()[i]));
  if (info.rank == 0 || address.empty()) return store;
  try {
    const size_t colon = address.rfind(':');
    return std::make_shared<TCPStore>(address.substr(0, colon),
                                      std::stoi(address.substr(colon + 1)), false, timeout);
  } catch (const std::exception&) {
    return nullptr;
  }
}

World& the_world() {
  static World w;
  return w;
}
std::mutex init_mu;

const char* getenv_or_null(const char* k) {
  const char* v = std::getenv(k);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, const char* value) {
  int v = 0;
  const char* end = value + std::strlen(value);
  auto [p, ec] = std::from_chars(value, end, v);
  FSDP_CHECK(ec == std::errc() && p == end, "[init_process_group] {}='{}' is not an integer", name,
             value);
  return v;
}

int required_int(const char* name) {
  const char* v = getenv_or_null(name);
  FSDP_CHECK(v,
             "[init_process_group] {} is not set (torchrun-style launch needs RANK, WORLD_SIZE, "
             "MASTER_ADDR and "
             "MASTER_PORT)",
             name);
  return env_int(name, v);
}

std::string gloo_hostname(const std::string& master) {
  std::string h = env_str("FSDP_GLOO_HOSTNAME");
  if (!h.empty()) return h;
  if (master == "localhost" || master.rfind("127.", 0) == 0 || master == "::1") return "127.0.0.1";
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// Rank 0 checks that every rank arrived with the same WORLD_SIZE, then
// publishes "ok" or the error, so that every rank fails with the same words.
// The job's run id: a rank of another job that reaches this store (two launches on one port)
// is refused by name before it touches the rendezvous.
std::string run_id() {
  std::string id = env_str("FSDP_RUN_ID");
  if (id.empty()) {
    const char* t = std::getenv("TORCHELASTIC_RUN_ID");
    id = t && *t ? t : "none";
  }
  return id;
}

void rendezvous(TCPStore& store, int rank, int size) {
  const std::string id = run_id();
  if (rank == 0) {
    store.set("rdzv/run_id", id);  // first: every other rank reads it before anything else
  } else {
    const std::string theirs = store.get_string("rdzv/run_id");
    FSDP_CHECK(theirs == id,
               "[init_process_group] the store at {} belongs to run '{}' but this rank (rank {}) "
               "is of run '{}': another job is using this MASTER_PORT; give each job its own "
               "port (fsdprun or torchrun --master-port), or the same --rdzv-id to join one",
               store.address(), theirs, rank, id);
  }
  store.set(fmt::format("rdzv/world_size/{}", rank), std::to_string(size));
  const auto timeout = store.timeout();
  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 1; r < size; ++r) keys.push_back(fmt::format("rdzv/world_size/{}", r));
    std::string error;
    if (!store.wait(keys, timeout)) {
      std::vector<int> missing;
      for (int r = 1; r < size; ++r)
        if (!store.check({keys[size_t(r - 1)]})) missing.push_back(r);
      error = fmt::format(
          "[init_process_group] only {} of {} ranks arrived at {} within {} s; missing rank(s): {}",
          size - int(missing.size()), size, store.address(), double(timeout.count()) / 1000.0,
          fmt::join(missing, ", "));
    } else {
      for (int r = 1; r < size && error.empty(); ++r) {
        std::string ws = store.get_string(keys[size_t(r - 1)]);
        if (ws != std::to_string(size))
          error = fmt::format(
              "[init_process_group] rank {} has WORLD_SIZE={} but rank 0 has WORLD_SIZE={}", r, ws,
              size);
      }
    }
    store.set("rdzv/status", error.empty() ? std::string("ok") : error);
    if (!error.empty()) {
      // This process serves the store: before it goes, let the ranks that
      // arrived read the error, so that they fail with the same words.
      int arrived = 0;
      for (int r = 1; r < size; ++r)
        arrived += store.check({fmt::format("rdzv/world_size/{}", r)}) ? 1 : 0;
      const auto deadline =
          std::chrono::steady_clock::now() + std::min(timeout, std::chrono::milliseconds(10000));
      while (store.add("rdzv/read", 0) < arrived && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      throw Error(error);
    }
  } else {
    if (!store.wait({"rdzv/status"}, timeout))
      FSDP_FAIL("[init_process_group] rank 0 at {} did not complete the rendezvous within {} s",
                store.address(), double(timeout.count()) / 1000.0);
    std::string status = store.get_string("rdzv/status");
    if (status != "ok") {
      store.add("rdzv/read", 1);
      throw Error(status);
    }
  }
}

}  // namespace

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& opt) {
  std::lock_guard<std::mutex> lock(init_mu);
  World& w = the_world();
  FSDP_CHECK(!w.group, "[init_process_group] already initialised (backend {})", w.info.backend);

  WorldInfo info;
  info.device = opt.device;
  const bool under_mpirun = getenv_or_null("OMPI_COMM_WORLD_SIZE") != nullptr;
  const bool under_torchrun =
      getenv_or_null("RANK") != nullptr || getenv_or_null("WORLD_SIZE") != nullptr;
  if (under_mpirun) {
    info.launcher = "mpirun";
    info.rank = env_int("OMPI_COMM_WORLD_RANK", getenv_or_null("OMPI_COMM_WORLD_RANK"));
    info.size = env_int("OMPI_COMM_WORLD_SIZE", getenv_or_null("OMPI_COMM_WORLD_SIZE"));
    if (auto v = getenv_or_null("OMPI_COMM_WORLD_LOCAL_RANK"))
      info.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", v);
    if (auto v = getenv_or_null("OMPI_COMM_WORLD_LOCAL_SIZE"))
      info.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", v);
  } else if (under_torchrun) {
    info.launcher = "torchrun";
    info.rank = required_int("RANK");
    info.size = required_int("WORLD_SIZE");
    info.local_rank = getenv_or_null("LOCAL_RANK") ? required_int("LOCAL_RANK") : info.rank;
    info.local_size =
        getenv_or_null("LOCAL_WORLD_SIZE") ? required_int("LOCAL_WORLD_SIZE") : info.size;
  }
  FSDP_CHECK(info.size >= 1, "[init_process_group] WORLD_SIZE must be >= 1, got {}", info.size);
  FSDP_CHECK(info.rank >= 0 && info.rank < info.size,
             "[init_process_group] RANK={} is not in [0, WORLD_SIZE={})", info.rank, info.size);

  std::string backend = opt.backend.empty() ? env_str("FSDP_BACKEND") : opt.backend;
  if (backend.empty()) {
    if (opt.device.is_cuda())
      backend = "nccl";
    else if (info.launcher == "mpirun")
      backend = "mpi";
    else if (info.launcher == "torchrun")
      backend = "gloo";
    else
      backend = "local";
  }
  FSDP_CHECK(backend == "mpi" || backend == "gloo" || backend == "nccl" || backend == "local",
             "[init_process_group] {}='{}'; expected mpi, gloo, nccl or local",
             opt.backend.empty() ? "FSDP_BACKEND" : "backend", backend);
  FSDP_CHECK(backend != "nccl" || opt.device.is_cuda(),
             "[init_process_group] backend nccl holds CUDA tensors but the device is {}",
             opt.device.str());
  FSDP_CHECK(backend != "local" || info.size == 1,
             "[init_process_group] the local backend is a world of one, but WORLD_SIZE is {}",
             info.size);
  info.backend = backend;
  if (opt.device.is_cuda()) {
    // One GPU per local rank, round robin: with fewer GPUs than local ranks, ranks share one
    // (MPI or Gloo only; NCCL refuses that below).
    FSDP_CHECK(cuda_device_count() > 0,
               "[init_process_group] --device {}: no CUDA device is visible", opt.device.str());
    info.device = Device::cuda(info.local_rank % cuda_device_count());
  }

  const auto store_timeout =
      std::chrono::milliseconds(int64_t(env_double("FSDP_STORE_TIMEOUT_S") * 1000.0));
  // A peer that goes away mid-send must be an error on this rank, not a SIGPIPE that kills it
  // (the store sends with MSG_NOSIGNAL; Gloo's and MPI's sockets may not).
  struct sigaction pipe_action {};
  if (sigaction(SIGPIPE, nullptr, &pipe_action) == 0 && pipe_action.sa_handler == SIG_DFL)
    std::signal(SIGPIPE, SIG_IGN);
  if (info.launcher == "torchrun" && backend != "mpi") {
    const char* addr = getenv_or_null("MASTER_ADDR");
    FSDP_CHECK(addr, "[init_process_group] MASTER_ADDR is not set (torchrun-style launch)");
    int port = required_int("MASTER_PORT");
    const std::string store_port = env_str("FSDP_STORE_PORT");
    const char* agent_store = getenv_or_null("TORCHELASTIC_USE_AGENT_STORE");
    if (!store_port.empty()) {
      port = env_int("FSDP_STORE_PORT", store_port.c_str());
    } else if (agent_store && std::string(agent_store) == "True") {
      port += 1;  // torchrun's agent already serves its own (torch) store on MASTER_PORT
    }
    w.store = std::make_shared<TCPStore>(addr, port, info.rank == 0, store_timeout);
    rendezvous(*w.store, info.rank, info.size);
  }

  // The host engine: MPI under mpirun, Gloo under torchrun-style launch, local for a world of
  // one. It is the whole world for CPU tensors, stages CUDA tensors for --backend mpi|gloo on
  // CUDA, and is the host half beside NCCL.
  auto host_engine = [&](const std::string& name,
                         Device tensor_device) -> std::shared_ptr<ProcessGroup> {
    if (name == "mpi") {
      auto g = std::make_shared<CpuProcessGroup>(make_mpi_world_backend(), tensor_device);
      w.mpi = true;
      FSDP_CHECK(g->size() == info.size,
                 "[init_process_group] MPI reports {} ranks but the launcher says {}", g->size(),
                 info.size);
      return g;
    }
    if (name == "gloo") {
      if (!w.store) {
        FSDP_CHECK(info.size == 1,
                   "[init_process_group] gloo needs torchrun-style launch (MASTER_ADDR, "
                   "MASTER_PORT) for {} ranks",
                   info.size);
        w.store = std::make_shared<TCPStore>("127.0.0.1", 0, true,
                                             store_timeout);  // a private store for one rank
      }
      const char* addr = getenv_or_null("MASTER_ADDR");
      return std::make_shared<CpuProcessGroup>(
          make_gloo_backend(w.store, info.rank, info.size,
                            gloo_hostname(addr ? addr : "127.0.0.1")),
          tensor_device);
    }
    FSDP_CHECK(info.size == 1,
               "[init_process_group] the local backend is a world of one, but WORLD_SIZE is {}",
               info.size);
    return std::make_shared<CpuProcessGroup>(make_local_backend(), tensor_device);
  };

  if (backend == "nccl") {
    const std::string host = info.launcher == "mpirun"     ? "mpi"
                             : info.launcher == "torchrun" ? "gloo"
                                                           : "local";
    auto host_group = host_engine(host, Device::cpu());
    w.group = std::make_shared<DeviceHostGroup>(make_nccl_world(info, *host_group), host_group);
  } else {
    w.group = host_engine(backend, info.device);
    if (env_str("FSDP_DIST_DEVICE_CHECK") == "1" && info.device.is_cpu()) {
      // The shape of a CUDA world on a machine without one: the same engine is the host half,
      // and a split of it, refusing every tensor, stands in for NCCL.
      auto stand_in = std::static_pointer_cast<CpuProcessGroup>(w.group->split(0, info.rank));
      stand_in->declare_device_stand_in();
      w.group = std::make_shared<DeviceHostGroup>(stand_in, w.group);
    }
  }
  w.group->set_label("world");
  w.info = info;
  if (info.size > 1) {
    if (!w.store && w.mpi)
      w.board_store = serve_board_store(*w.group, info, std::chrono::seconds(10));
    watchdog::start_board(w.store ? w.store : w.board_store, info.rank, info.size);
  }
  return w.group;
}

bool is_initialized() { return the_world().group != nullptr; }

std::shared_ptr<ProcessGroup> world() {
  FSDP_CHECK(is_initialized(), "[dist] call fsdp::dist::init_process_group() first");
  return the_world().group;
}

const WorldInfo& world_info() {
  FSDP_CHECK(is_initialized(), "[dist] call fsdp::dist::init_process_group() first");
  return the_world().info;
}

std::shared_ptr<TCPStore> world_store() { return the_world().store; }

void destroy_process_group() {
  std::lock_guard<std::mutex> lock(init_mu);
  World& w = the_world();
  if (!w.group) return;
  watchdog::stop_board();
  w.group->barrier()
      ->wait();  // rank 0 serves the store: nobody leaves while others may still need it
  w.group.reset();
  w.store.reset();
  w.board_store.reset();
  if (w.mpi) mpi_finalize();
  w = World{};
}

void abort_process(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (the_world().mpi) mpi_abort(code);
  std::_Exit(code);
}

}  // namespace fsdp::dist
