// The TCP store's server (store_server.h): the accept loop that takes each connection's hello, the
// threads that serve this run's connections, and the key-value data they share. The server closes
// a connection whose hello is not complete within a second or whose first bytes are not the magic
// (store_wire.h); every length is bounded before it is allocated.
#include "src/distributed/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
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
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <ratio>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

#include "fsdp/core/error.h"

namespace fsdp::dist {

using namespace wire;

TCPStore::Server::Server(const std::string& host, int port, std::chrono::milliseconds timeout, std::string run_id)
    : timeout_(timeout), run_id_(std::move(run_id)) {
  // The job's address, not every interface: loopback for a loopback MASTER_ADDR (one node);
  // else what MASTER_ADDR names here. A name that is loopback here but may not be elsewhere
  // (a hostname Debian maps to 127.0.1.1), or one that is no address of this machine (NAT),
  // is served on every interface as before: the run id still keeps strangers out.
  const bool loopback_name = is_loopback_name(host);
  int err = 0;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (!host.empty() && ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) == 0) {
    for (addrinfo* a = res; a && listen_fd_ < 0; a = a->ai_next) {
      const bool is_lo =
          (a->ai_family == AF_INET &&
           (ntohl(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) == 127) ||
          (a->ai_family == AF_INET6 &&
           IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr));
      if (is_lo && !loopback_name) continue;
      const int fd = ::socket(a->ai_family, SOCK_STREAM, 0);
      if (fd < 0) continue;
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
        listen_fd_ = fd;
      } else {
        if (err == 0 || errno == EADDRINUSE) err = errno;
        ::close(fd);
      }
    }
    ::freeaddrinfo(res);
  }
  if (listen_fd_ < 0 && err != EADDRINUSE && !loopback_name) bind_any(port, err);
  if (listen_fd_ < 0)
    FSDP_FAIL("[store] cannot serve on port {}: {}{}", port, std::strerror(err ? err : EINVAL),
              err == EADDRINUSE ? " (is another job using MASTER_PORT? pick a free one)" : "");
  FSDP_CHECK(::listen(listen_fd_, 128) == 0, "[store] listen on port {} failed: {}", port,
             std::strerror(errno));
  ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);  // accept4 below
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  accept_thread_ = std::thread([this] { accept_loop(); });
}

TCPStore::Server::~Server() {
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  accept_thread_.join();
  ::close(listen_fd_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : clients_) ::shutdown(c->fd, SHUT_RDWR);
  }
  cv_.notify_all();
  for (auto& c : clients_) {
    c->thread.join();
    ::close(c->fd);
  }
}

void TCPStore::Server::bind_any(int port, int& err) {
  listen_fd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
  const bool v6 = listen_fd_ >= 0;
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
    err = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
  }
}

// Joins the threads of closed connections: a flood of them holds nothing.
void TCPStore::Server::reap() {
  std::list<std::unique_ptr<Client>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = clients_.begin(); it != clients_.end();) {
      if ((*it)->done) {
        finished.push_back(std::move(*it));
        it = clients_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) {
    c->thread.join();
    ::close(c->fd);
  }
}

// Reads what the hello has sent; -1: close it, 0: more to come, 1: this run's, served.
int TCPStore::Server::advance(Pending& p) {
  const size_t head = sizeof(kMagic) + 4;
  for (;;) {
    size_t want = head;
    if (p.got >= head) {
      uint32_t idlen;
      std::memcpy(&idlen, p.buf + sizeof(kMagic), 4);
      if (idlen > kMaxId) return -1;
      want = head + idlen;
    }
    if (p.got >= want) break;
    const ssize_t r = ::recv(p.fd, p.buf + p.got, want - p.got, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (r <= 0) return -1;
    p.got += size_t(r);
    if (!magic_prefix(p.buf, p.got)) return -1;
  }
  const std::string id(p.buf + head, p.got - head);
  char welcome[sizeof(kMagic) + 1];
  std::memcpy(welcome, kMagic, sizeof(kMagic));
  welcome[sizeof(kMagic)] = id == run_id_ ? 0 : 3;  // another run: told so, not which run this is
  if (!send_all(p.fd, welcome, sizeof(welcome)) || id != run_id_) return -1;
  return 1;
}

void TCPStore::Server::start_serving(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ || clients_.size() >= kMaxClients) {
    ::close(fd);
    return;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // replies are sent whole
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto c = std::make_unique<Client>();
  c->fd = fd;
  Client* raw = c.get();
  clients_.push_back(std::move(c));
  try {
    raw->thread = std::thread([this, raw] {
      serve(raw->fd);
      raw->done = true;
    });
  } catch (const std::system_error&) {  // no thread to be had: drop this connection
    clients_.pop_back();
    ::close(fd);
  }
}

void TCPStore::Server::accept_loop() {
  std::vector<Pending> pending;
  std::vector<pollfd> fds;
  while (!stop_) {
    reap();
    fds.assign(1, pollfd{listen_fd_, POLLIN, 0});
    for (auto& p : pending) fds.push_back(pollfd{p.fd, POLLIN, 0});
    const int rc = ::poll(fds.data(), nfds_t(fds.size()), 100);
    if (stop_) break;
    const auto now = Clock::now();
    std::vector<Pending> next;
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      int state = 0;
      if (rc > 0 && fds[i + 1].revents) state = advance(p);
      if (state == 0 && now >= p.deadline) state = -1;
      if (state < 0)
        ::close(p.fd);
      else if (state > 0)
        start_serving(p.fd);
      else
        next.push_back(p);
    }
    pending.swap(next);
    if (rc > 0 && (fds[0].revents & POLLIN)) {
      // all that wait, up to the bound (a flood beyond it is closed: a rank's client retries)
      for (int n = 0; n < 256; ++n) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        if (pending.size() >= kMaxPending) {
          ::close(fd);
          continue;
        }
        Pending p{};
        p.fd = fd;
        p.deadline = now + kHelloWithin;
        // What has already arrived (a hello, or a stranger's close) is read at once, without
        // another trip through poll.
        const int state = advance(p);
        if (state < 0)
          ::close(fd);
        else if (state > 0)
          start_serving(fd);
        else
          pending.push_back(p);
      }
    }
  }
  for (auto& p : pending) ::close(p.fd);
}

void TCPStore::Server::serve(int fd) {
  const auto none = Clock::time_point::max();
  for (;;) {
    uint8_t op;
    uint32_t nkeys;
    // Between requests a rank's connection may idle (the whole run); within one, a stall
    // of kStallWithin ends it.
    if (recv_for(fd, &op, 1, none) != Recv::ok ||
        recv_for(fd, &nkeys, 4, none, kStallWithin) != Recv::ok ||
        nkeys > kMaxKeys)
      break;
    std::vector<std::string> keys(nkeys);
    bool ok = true;
    size_t key_bytes = 0;
    for (auto& k : keys) {
      uint32_t len;
      if (recv_for(fd, &len, 4, none, kStallWithin) != Recv::ok ||
          (key_bytes += len) > kMaxKeyBytes) {
        ok = false;
        break;
      }
      k.resize(len);
      if (recv_for(fd, k.data(), len, none, kStallWithin) != Recv::ok) {
        ok = false;
        break;
      }
    }
    uint32_t vlen = 0;
    if (!ok || recv_for(fd, &vlen, 4, none, kStallWithin) != Recv::ok ||
        vlen > kMaxValue)
      break;
    std::vector<char> value(vlen);
    int64_t arg = 0;
    if (recv_for(fd, value.data(), vlen, none, kStallWithin) != Recv::ok ||
        recv_for(fd, &arg, 8, none, kStallWithin) != Recv::ok)
      break;

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
}

}  // namespace fsdp::dist
