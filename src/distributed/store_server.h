// The TCP store's server half (store_server.cpp): one poll loop takes every new connection's
// hello (at most kMaxPending at once); a connection that presents this run's id gets a thread,
// joined when it closes; blocking get and wait are served with a condition variable. The wire
// format is store_wire.h's; the client half is store.cpp.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/distributed/store.h"
#include "src/distributed/store_wire.h"

namespace fsdp::dist {

class TCPStore::Server {
 public:
  Server(const std::string& host, int port, std::chrono::milliseconds timeout, std::string run_id);

  int port() const { return port_; }

  ~Server();

 private:
  struct Client {
    int fd = -1;
    std::atomic<bool> done{false};
    std::thread thread;
  };

  void bind_any(int port, int& err);
  // Joins the threads of closed connections: a flood of them holds nothing.
  void reap();
  // One thread takes every new connection's hello in a poll loop, so that a stranger (a flood
  // of connect-and-close, a silent connection, garbage) costs no thread and at most a hello's
  // bytes, and is closed at its first bad byte or after kHelloWithin. Only a connection that
  // presented this run's id gets a serving thread.
  struct Pending {
    int fd;
    wire::Clock::time_point deadline;
    char buf[sizeof(wire::kMagic) + 4 + wire::kMaxId];
    size_t got = 0;
  };

  // Reads what the hello has sent; -1: close it, 0: more to come, 1: this run's, served.
  int advance(Pending& p);
  void start_serving(int fd);
  void accept_loop();
  void serve(int fd);

  std::chrono::milliseconds timeout_;
  std::string run_id_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> data_;
  std::list<std::unique_ptr<Client>> clients_;
};

}  // namespace fsdp::dist
