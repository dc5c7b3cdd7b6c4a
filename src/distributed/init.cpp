// Rendezvous and the world group.
#include "fsdp/distributed/init.h"

#include <arpa/inet.h>
#include <fmt/core.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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
#include "fsdp/distributed/launch_env.h"
#include "src/distributed/cpu_group.h"
#include "src/distributed/device_host_group.h"
#include "src/distributed/nccl/nccl_group.h"
#include "src/distributed/transport.h"
#include "src/distributed/watchdog.h"

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
                                            std::chrono::milliseconds timeout,
                                            const std::string& id) {
  std::shared_ptr<TCPStore> store;
  Tensor where = Tensor::zeros({256}, DType::i32);
  try {
    if (info.rank == 0) {
      char host[200] = "127.0.0.1";  // every rank on this machine: loopback
      if (info.local_size != info.size && ::gethostname(host, sizeof(host) - 1) != 0)
        std::strcpy(host, "127.0.0.1");
      store = std::make_shared<TCPStore>(host, 0, true, timeout, id);
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
                                      std::stoi(address.substr(colon + 1)), false, timeout, id);
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

// The address this rank's Gloo listens on and publishes to its peers, which must reach it from
// their hosts: FSDP_GLOO_HOSTNAME; else the IPv4 address of the interface that GLOO_SOCKET_IFNAME
// (or FSDP_SOCKET_IFNAME) names; else loopback when the master is; else this host's address on
// the route to MASTER_ADDR (a UDP connect picks the route and sends nothing). The host name is not
// used: it often resolves to a loopback or container address that other hosts cannot reach.
std::string gloo_hostname(const std::string& master) {
  std::string h = env_str("FSDP_GLOO_HOSTNAME");
  if (!h.empty()) return h;
  const char* gloo_ifname = getenv_or_null("GLOO_SOCKET_IFNAME");  // Gloo's own name for it
  const std::string ifname = gloo_ifname ? gloo_ifname : env_str("FSDP_SOCKET_IFNAME");
  if (!ifname.empty()) {
    ifaddrs* all = nullptr;
    FSDP_CHECK(::getifaddrs(&all) == 0, "[init_process_group] listing interfaces failed: {}",
               std::strerror(errno));
    std::string found;
    for (ifaddrs* i = all; i && found.empty(); i = i->ifa_next)
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && ifname == i->ifa_name) {
        char buf[INET_ADDRSTRLEN] = {0};
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf,
                    sizeof(buf));
        found = buf;
      }
    ::freeifaddrs(all);
    FSDP_CHECK(
        !found.empty(),
        "[init_process_group] GLOO_SOCKET_IFNAME/FSDP_SOCKET_IFNAME='{}' is not an interface "
        "of this host with an IPv4 address (see `ip -4 addr`)",
        ifname);
    return found;
  }
  if (master == "localhost" || master.rfind("127.", 0) == 0 || master == "::1") return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(master.c_str(), "9", &hints, &res);
  FSDP_CHECK(rc == 0 && res, "[init_process_group] MASTER_ADDR '{}' does not resolve: {}", master,
             ::gai_strerror(rc));
  std::string local;
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  int err = 0;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof(me);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
      char buf[INET_ADDRSTRLEN] = {0};
      ::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf));
      local = buf;
    }
  } else {
    err = errno;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  FSDP_CHECK(!local.empty(), "[init_process_group] MASTER_ADDR '{}': no route from this host: {}",
             master, std::strerror(err));
  return local;
}

// Rank 0 checks that every rank arrived with the same WORLD_SIZE, then
// publishes "ok" or the error, so that every rank fails with the same words.
// The job's run id: a rank of another job that reaches this store (two launches on one port)
// is refused by name before it touches the rendezvous.
std::string run_id(const LaunchEnv& launch) {
  std::string id = env_str("FSDP_RUN_ID");
  if (id.empty()) id = launch.run_id.empty() ? "none" : launch.run_id;
  return id;
}

void rendezvous(TCPStore& store, int rank, int size, const std::string& id) {
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
  // One process per rank: a second one with this RANK (two rank-1s) is named, not run.
  const int64_t holders = store.add(fmt::format("rdzv/rank/{}", rank), 1);
  FSDP_CHECK(holders == 1,
             "[init_process_group] RANK={} is already taken at the store {} by another process "
             "of run '{}' ({} processes have claimed it): each process needs its own RANK in "
             "0..{}; check the launcher's RANK and WORLD_SIZE",
             rank, store.address(), id, holders, size - 1);
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
  validate_env();  // every FSDP_* knob's value, by name, before any of them is used

  WorldInfo info;
  info.device = opt.device;
  const LaunchEnv launch = read_launch_env();  // refuses a world of several with no way to meet
  info.launcher = launch.launcher;
  info.rank = launch.rank, info.size = launch.size;
  info.local_rank = launch.local_rank, info.local_size = launch.local_size;
  // Meeting through the TCP store: torchrun-style launch, and Slurm steps unless MPI meets
  // through PMIx.
  const bool store_launch =
      info.launcher == "torchrun" || (info.launcher == "slurm" && !launch.pmix && info.size > 1);

  std::string backend = opt.backend.empty() ? env_str("FSDP_BACKEND") : opt.backend;
  if (backend.empty()) {
    if (opt.device.is_cuda())
      backend = "nccl";
    else if (info.launcher == "mpirun" || (info.launcher == "slurm" && launch.pmix))
      backend = "mpi";
    else if (store_launch)
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
  if (store_launch && backend != "mpi") {
    FSDP_CHECK(
        !launch.master_addr.empty(),
        "[init_process_group] MASTER_ADDR is not set (torchrun-style launch of WORLD_SIZE={})",
        info.size);
    const std::string addr = launch.master_addr;
    {  // an unresolvable name is an error now, not after the store's time-out
      addrinfo hints{};
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* res = nullptr;
      const int rc = ::getaddrinfo(addr.c_str(), nullptr, &hints, &res);
      if (res) ::freeaddrinfo(res);
      FSDP_CHECK(rc == 0,
                 "[init_process_group] MASTER_ADDR '{}' (the store at {}:{}) does not resolve: {}",
                 addr, addr, launch.master_port, ::gai_strerror(rc));
    }
    FSDP_CHECK(launch.master_port > 0,
               "[init_process_group] MASTER_PORT is not set (torchrun-style launch needs RANK, "
               "WORLD_SIZE, MASTER_ADDR and MASTER_PORT)");
    int port = launch.master_port;
    const std::string store_port = env_str("FSDP_STORE_PORT");
    const char* agent_store = getenv_or_null("TORCHELASTIC_USE_AGENT_STORE");
    if (!store_port.empty()) {
      port = env_int("FSDP_STORE_PORT", store_port.c_str());
    } else if (agent_store && std::string(agent_store) == "True") {
      port += 1;  // torchrun's agent already serves its own (torch) store on MASTER_PORT
    }
    // the run id is the connection's identity: a stranger, or another job's rank, is closed
    w.store = std::make_shared<TCPStore>(addr, port, info.rank == 0, store_timeout, run_id(launch));
    rendezvous(*w.store, info.rank, info.size, run_id(launch));
  }

  // The host engine: MPI under mpirun, Gloo under torchrun-style launch, local for a world of
  // one. It is the whole world for CPU tensors, stages CUDA tensors for --backend mpi|gloo on
  // CUDA, and is the host half beside NCCL.
  auto host_engine = [&](const std::string& name,
                         Device tensor_device) -> std::shared_ptr<ProcessGroup> {
    if (name == "mpi") {
      auto g = std::make_shared<CpuProcessGroup>(make_mpi_world_transport(), tensor_device);
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
      return std::make_shared<CpuProcessGroup>(
          make_gloo_transport(
              w.store, info.rank, info.size,
              gloo_hostname(launch.master_addr.empty() ? "127.0.0.1" : launch.master_addr)),
          tensor_device);
    }
    FSDP_CHECK(info.size == 1,
               "[init_process_group] the local backend is a world of one, but WORLD_SIZE is {}",
               info.size);
    return std::make_shared<CpuProcessGroup>(make_local_transport(), tensor_device);
  };

  if (backend == "nccl") {
    const std::string host = info.launcher == "mpirun" || (info.launcher == "slurm" && launch.pmix)
                                 ? "mpi"
                             : store_launch ? "gloo"
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
      w.board_store = serve_board_store(*w.group, info, std::chrono::seconds(10), run_id(launch));
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

void abort_process(const std::exception& error, std::string_view program) {
  fmt::print(stderr, "{}: error: {}\n", program, error.what());
  abort_process(1);
}

}  // namespace fsdp::dist
