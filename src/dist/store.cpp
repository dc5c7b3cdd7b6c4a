// TCPStore: a thread per client on the server, blocking get/wait served with
// a condition variable. Wire format, both directions little-endian:
//   request  = op:u8 nkeys:u32 (len:u32 bytes)* vlen:u32 bytes arg:i64
//   response = status:u8 (0 ok, 1 timed out) len:u32 bytes
#include "fsdp/dist/store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <compare>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <stdexcept>
#include <thread>

#include "fsdp/core/error.h"
#include "fsdp/core/interrupt.h"

namespace fsdp::dist {

namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kCheck = 5 };

bool send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= size_t(w);
  }
  return true;
}

bool recv_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= size_t(r);
  }
  return true;
}

template <class T>
void put(std::vector<char>& b, T v) {
  const char* p = reinterpret_cast<const char*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}
void put_bytes(std::vector<char>& b, const char* p, size_t n) {
  put<uint32_t>(b, uint32_t(n));
  b.insert(b.end(), p, p + n);
}

}  // namespace

// ---------------------------------------------------------------- server

class TCPStore::Server {
 public:
  Server(int port, std::chrono::milliseconds timeout) : timeout_(timeout) {
    listen_fd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
    bool v6 = listen_fd_ >= 0;
    if (!v6) listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    FSDP_CHECK(listen_fd_ >= 0, "[store] socket() failed: {}", std::strerror(errno));
    int one = 1, zero = 0;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc;
    if (v6) {
      ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // also serve IPv4
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(uint16_t(port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(uint16_t(port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    }
    if (rc != 0) {
      int err = errno;
      ::close(listen_fd_);
      FSDP_FAIL("[store] cannot serve on port {}: {}{}", port, std::strerror(err),
                err == EADDRINUSE ? " (is another job using MASTER_PORT? pick a free one)" : "");
    }
    FSDP_CHECK(::listen(listen_fd_, 128) == 0, "[store] listen on port {} failed: {}", port,
               std::strerror(errno));
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  int port() const { return port_; }

  ~Server() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    accept_thread_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::lock_guard<std::mutex> lock(mu_);
      clients_.push_back(fd);
      threads_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    for (;;) {
      uint8_t op;
      uint32_t nkeys;
      if (!recv_all(fd, &op, 1) || !recv_all(fd, &nkeys, 4) || nkeys > (1u << 20)) break;
      std::vector<std::string> keys(nkeys);
      bool ok = true;
      for (auto& k : keys) {
        uint32_t len;
        if (!recv_all(fd, &len, 4) || len > (1u << 24)) {
          ok = false;
          break;
        }
        k.resize(len);
        if (!recv_all(fd, k.data(), len)) ok = false;
      }
      uint32_t vlen = 0;
      if (!ok || !recv_all(fd, &vlen, 4) || vlen > (1u << 26)) break;  // 64 MiB: rendezvous data
      std::vector<char> value(vlen);
      int64_t arg = 0;
      if (!recv_all(fd, value.data(), vlen) || !recv_all(fd, &arg, 8)) break;

      uint8_t status = 0;
      std::vector<char> out;
      // A request from outside (another job, a port scanner) must never end this rank: a
      // malformed one is answered with status 2 (set, get and add name one key; add adds to a
      // number).
      if ((op == kSet || op == kGet || op == kAdd) && keys.size() != 1) op = 0xFF;
      try {
        std::unique_lock<std::mutex> lock(mu_);
        auto have_all = [&] {
          for (auto& k : keys)
            if (!data_.count(k)) return false;
          return true;
        };
        switch (op) {
          case kSet:
            data_[keys.at(0)] = value;
            cv_.notify_all();
            break;
          case kGet:
          case kWait: {
            // (a client's wait is at most a day: a larger one would overflow the clock)
            const auto wait_for = op == kWait ? std::chrono::milliseconds(std::clamp<int64_t>(
                                                    arg, 0, int64_t(24) * 3600 * 1000))
                                              : timeout_;
            if (!cv_.wait_for(lock, wait_for, [&] { return stop_ || have_all(); }) || stop_)
              status = 1;
            else if (op == kGet)
              out = data_[keys.at(0)];
            break;
          }
          case kAdd: {
            auto& v = data_[keys.at(0)];
            int64_t cur = v.empty() ? 0 : std::stoll(std::string(v.begin(), v.end()));
            if (__builtin_add_overflow(cur, arg, &cur)) throw std::overflow_error("add");
            std::string s = std::to_string(cur);
            v.assign(s.begin(), s.end());
            out = v;
            cv_.notify_all();
            break;
          }
          case kCheck:
            out.push_back(have_all() ? 1 : 0);
            break;
          default:
            status = 2;
        }
      } catch (const std::exception&) {  // std::stoll on a value that is not a number
        status = 2;
        out.clear();
      }
      std::vector<char> resp;
      resp.push_back(char(status));
      put_bytes(resp, out.data(), out.size());
      if (!send_all(fd, resp.data(), resp.size())) break;
    }
    ::close(fd);
  }

  std::chrono::milliseconds timeout_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> data_;
  std::vector<int> clients_;
  std::vector<std::thread> threads_;
};

// ---------------------------------------------------------------- client

TCPStore::TCPStore(const std::string& host, int port, bool is_server,
                   std::chrono::milliseconds timeout)
    : timeout_(timeout) {
  FSDP_CHECK((port > 0 || (port == 0 && is_server)) && port < 65536,
             "[store] MASTER_PORT must be in 1..65535, got {}", port);
  if (is_server) {
    server_ = std::make_unique<Server>(port, timeout);
    port = server_->port();  // port 0: the system picked a free one
  }
  address_ = fmt::format("{}:{}", host, port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last_error = ::gai_strerror(gai);
    } else {
      for (addrinfo* a = res; a; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          fd_ = fd;
          break;
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0) break;
    throw_if_interrupted(fmt::format("the rendezvous store at {} to answer", address_));
    if (std::chrono::steady_clock::now() >= deadline)
      FSDP_FAIL(
          "[store] cannot reach the store at MASTER_ADDR:MASTER_PORT = {} within {} s ({}); check "
          "that rank 0 "
          "is running and that every rank has the same MASTER_ADDR and MASTER_PORT",
          address_, double(timeout.count()) / 1000.0, last_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

TCPStore::~TCPStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::vector<char> TCPStore::request(uint8_t op, const std::vector<std::string>& keys,
                                    const std::vector<char>& value, int64_t arg, bool* timed_out) {
  std::vector<char> msg;
  msg.push_back(char(op));
  put<uint32_t>(msg, uint32_t(keys.size()));
  for (auto& k : keys) put_bytes(msg, k.data(), k.size());
  put_bytes(msg, value.data(), value.size());
  put<int64_t>(msg, arg);
  std::lock_guard<std::mutex> lock(mu_);
  FSDP_CHECK(send_all(fd_, msg.data(), msg.size()),
             "[store] lost the connection to {} (rank 0 gone?)", address_);
  // The answer may take up to the wait's time-out: poll, so that a stop signal ends the wait.
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, 100);
    if (rc > 0 || (rc < 0 && errno != EINTR)) break;
    throw_if_interrupted(fmt::format("the rendezvous store at {}{}", address_,
                                     keys.empty() ? std::string() : " (key '" + keys[0] + "')"));
  }
  uint8_t status;
  uint32_t len;
  FSDP_CHECK(recv_all(fd_, &status, 1) && recv_all(fd_, &len, 4),
             "[store] lost the connection to {} (rank 0 gone?)", address_);
  std::vector<char> out(len);
  FSDP_CHECK(recv_all(fd_, out.data(), len), "[store] lost the connection to {} (rank 0 gone?)",
             address_);
  FSDP_CHECK(status != 2, "[store] the server at {} refused request {}", address_, int(op));
  if (timed_out) *timed_out = status == 1;
  return out;
}

void TCPStore::set(const std::string& key, const std::vector<char>& value) {
  request(kSet, {key}, value, 0, nullptr);
}

void TCPStore::set(const std::string& key, const std::string& value) {
  set(key, std::vector<char>(value.begin(), value.end()));
}

std::vector<char> TCPStore::get(const std::string& key) {
  bool timed_out = false;
  auto v = request(kGet, {key}, {}, 0, &timed_out);
  FSDP_CHECK(!timed_out, "[store] key '{}' did not appear at {} within {} s", key, address_,
             double(timeout_.count()) / 1000.0);
  return v;
}

std::string TCPStore::get_string(const std::string& key) {
  auto v = get(key);
  return std::string(v.begin(), v.end());
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  auto v = request(kAdd, {key}, {}, delta, nullptr);
  return std::stoll(std::string(v.begin(), v.end()));
}

bool TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  bool timed_out = false;
  request(kWait, keys, {}, timeout.count(), &timed_out);
  return !timed_out;
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  auto v = request(kCheck, keys, {}, 0, nullptr);
  return !v.empty() && v[0] == 1;
}

}  // namespace fsdp::dist
