// A TCP key-value store for rendezvous only (the NCCL unique id, Gloo's
// pair addresses, the arrival of ranks), in the spirit of torch's TCPStore.
// Rank 0 serves it on MASTER_PORT; every rank, rank 0 included, is a client.
// get() and wait() block until the key exists or the store's time-out
// passes; every failure names the address and what was awaited.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fsdp::dist {

class TCPStore {
 public:
  // is_server: bind and serve (rank 0) on the address `host` names (loopback
  // for a loopback host), not on every interface; throws at once if the port
  // is taken; port 0 lets the system pick one (a world of one). Every rank
  // then connects, retrying until `timeout`, and presents `run_id` before
  // anything else: the server closes a connection that does not (another
  // job, a port scanner, an HTTP client) within a second, and a client of
  // another run fails by name.
  TCPStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout,
           const std::string& run_id = "");
  ~TCPStore();
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  void set(const std::string& key, const std::string& value);
  std::vector<char> get(
      const std::string& key);  // blocks until the key exists, throws after the time-out
  std::string get_string(const std::string& key);
  int64_t add(const std::string& key, int64_t delta);  // returns the new value
  // True when all keys exist; false if `timeout` passed first.
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  bool check(const std::vector<std::string>& keys);

  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& address() const { return address_; }

 private:
  class Server;
  std::unique_ptr<Server> server_;
  int fd_ = -1;
  std::string address_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;  // one request at a time on the connection
  std::vector<char> request(uint8_t op, const std::vector<std::string>& keys,
                            const std::vector<char>& value, int64_t arg, bool* timed_out);
};

}  // namespace fsdp::dist
