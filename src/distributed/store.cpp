// TCPStore: one poll loop on the server takes every new connection's hello (at
// most kMaxPending at once); a connection of this run then gets a thread, joined
// when it closes; blocking get/wait served with a condition variable. Wire
// format, both directions little-endian:
//   hello    = "FSDPST01" idlen:u32 id      (client, first; id = the run id)
//   welcome  = "FSDPST01" status:u8         (0 ok, 3 another run: then closed)
//   request  = op:u8 nkeys:u32 (len:u32 bytes)* vlen:u32 bytes arg:i64
//   response = status:u8 (0 ok, 1 timed out, 2 refused) len:u32 bytes
// The server closes a connection whose hello is not complete within a second
// or whose first bytes are not the magic; every length is bounded before it
// is allocated, on both sides; every client wait has a deadline and polls the
// stop flag.
#include "fsdp/distributed/store.h"

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
#include "fsdp/core/interrupt.h"

namespace fsdp::dist {

namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kCheck = 5 };

constexpr char kMagic[8] = {'F', 'S', 'D', 'P', 'S', 'T', '0', '1'};
constexpr uint32_t kMaxId = 256;              // a run id
constexpr uint32_t kMaxKeys = 1u << 16;       // keys in one wait (one a rank)
constexpr uint32_t kMaxKeyBytes = 1u << 20;   // all keys of a request together
constexpr uint32_t kMaxValue = 1u << 26;      // 64 MiB: rendezvous data
constexpr size_t kMaxPending = 1024;  // connections not past their hello yet
constexpr size_t kMaxClients = 1u << 16;  // connections of this run served at once (one a rank)
constexpr auto kHelloWithin = std::chrono::milliseconds(1000);
constexpr auto kStallWithin = std::chrono::milliseconds(1000);  // inside one message

using Clock = std::chrono::steady_clock;
enum class Recv { ok, closed, timed_out };

// Reads n bytes by `deadline` (Clock::time_point::max(): none). stall: a message already begun
// must go on within this; each wait is cut in slices of at most 100 ms where tick is given (it
// may throw: the client's stop flag). check_prefix, when given, sees the bytes read so far after
// each read and may end the read (false: closed at the first bad byte).
Recv recv_for(int fd, void* p, size_t n, Clock::time_point deadline,
              std::chrono::milliseconds stall = std::chrono::milliseconds(0),
              const std::function<void()>& tick = {},
              const std::function<bool(const char*, size_t)>& check_prefix = {}) {
  char* c = static_cast<char*>(p);
  size_t got = 0;
  auto progress = Clock::now();
  while (got < n) {
    const auto now = Clock::now();
    const auto until = stall.count() > 0 ? std::min(deadline, progress + stall) : deadline;
    if (now >= until) return Recv::timed_out;
    int wait_ms = -1;
    if (until != Clock::time_point::max())
      wait_ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count()) + 1;
    if (tick && (wait_ms < 0 || wait_ms > 100)) wait_ms = 100;
    pollfd pf{fd, POLLIN, 0};
    const int rc = ::poll(&pf, 1, wait_ms);
    if (rc < 0 && errno != EINTR) return Recv::closed;
    if (rc <= 0) {
      if (tick) tick();
      continue;
    }
    const ssize_t r = ::recv(fd, c + got, n - got, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r <= 0) return Recv::closed;
    got += size_t(r);
    progress = Clock::now();
    if (check_prefix && !check_prefix(c, got)) return Recv::closed;
  }
  return Recv::ok;
}

bool magic_prefix(const char* c, size_t n) {
  return std::memcmp(c, kMagic, std::min(n, sizeof(kMagic))) == 0;
}

bool is_loopback_name(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

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
  Server(const std::string& host, int port, std::chrono::milliseconds timeout, std::string run_id)
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

  int port() const { return port_; }

  ~Server() {
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

 private:
  struct Client {
    int fd = -1;
    std::atomic<bool> done{false};
    std::thread thread;
  };

  void bind_any(int port, int& err) {
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
  void reap() {
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

  // One thread takes every new connection's hello in a poll loop, so that a stranger (a flood
  // of connect-and-close, a silent connection, garbage) costs no thread and at most a hello's
  // bytes, and is closed at its first bad byte or after kHelloWithin. Only a connection that
  // presented this run's id gets a serving thread.
  struct Pending {
    int fd;
    Clock::time_point deadline;
    char buf[sizeof(kMagic) + 4 + kMaxId];
    size_t got = 0;
  };

  // Reads what the hello has sent; -1: close it, 0: more to come, 1: this run's, served.
  int advance(Pending& p) {
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

  void start_serving(int fd) {
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

  void accept_loop() {
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

  void serve(int fd) {
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

// ---------------------------------------------------------------- client

namespace {

// What a reply that is not the store's looks like, for the error: its first bytes, printable.
std::string shown(const char* c, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char ch = static_cast<unsigned char>(c[i]);
    if (ch == '\r') out += "\\r";
    else if (ch == '\n') out += "\\n";
    else if (ch >= 32 && ch < 127) out.push_back(char(ch));
    else out += fmt::format("\\x{:02x}", ch);
  }
  return out;
}

}  // namespace

TCPStore::TCPStore(const std::string& host, int port, bool is_server,
                   std::chrono::milliseconds timeout, const std::string& run_id)
    : timeout_(timeout) {
  FSDP_CHECK((port > 0 || (port == 0 && is_server)) && port < 65536,
             "[store] MASTER_PORT must be in 1..65535, got {}", port);
  FSDP_CHECK(run_id.size() <= kMaxId, "[store] the run id '{}' is longer than {} bytes", run_id,
             kMaxId);
  if (is_server) {
    server_ = std::make_unique<Server>(host, port, timeout, run_id);
    port = server_->port();  // port 0: the system picked a free one
  }
  address_ = fmt::format("{}:{}", host, port);
  const auto deadline = Clock::now() + timeout;
  const std::string waiting_for = fmt::format("the rendezvous store at {} to answer", address_);
  auto tick = [&] { throw_if_interrupted(waiting_for); };
  std::vector<char> hello_msg(kMagic, kMagic + sizeof(kMagic));
  put_bytes(hello_msg, run_id.data(), run_id.size());
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
        // connect and every send give up by the time-out (Linux: SO_SNDTIMEO bounds connect)
        const auto left = std::max<int64_t>(
            1, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())
                   .count());
        timeval tv{time_t(left / 1000), suseconds_t((left % 1000) * 1000)};
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          fd_ = fd;
          break;
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0) {  // the hello; the server's welcome by the deadline
      char welcome[sizeof(kMagic) + 1] = {};
      Recv got = Recv::closed;
      size_t seen = 0;
      try {
        if (send_all(fd_, hello_msg.data(), hello_msg.size()))
          got = recv_for(fd_, welcome, sizeof(welcome), deadline, {}, tick,
                         [&](const char* c, size_t n) {
                           seen = n;
                           return magic_prefix(c, n);
                         });
      } catch (...) {
        ::close(fd_);
        fd_ = -1;
        throw;
      }
      if (got == Recv::ok && welcome[sizeof(kMagic)] == 0) break;
      ::close(fd_);
      fd_ = -1;
      if (seen > 0 && !magic_prefix(welcome, seen))
        FSDP_FAIL(
            "[store] the server at MASTER_ADDR:MASTER_PORT = {} is not an fsdp store (it answered "
            "'{}'): another program is listening on MASTER_PORT; give the job a free port",
            address_, shown(welcome, seen));
      if (got == Recv::ok) {
        FSDP_CHECK(welcome[sizeof(kMagic)] == 3,
                   "[store] the server at {} is not an fsdp store of this version (it answered "
                   "status {})",
                   address_, int(static_cast<unsigned char>(welcome[sizeof(kMagic)])));
        FSDP_FAIL(
            "[store] the store at {} belongs to another run, not to this rank's run '{}': another "
            "job is using this MASTER_PORT; give each job its own port (fsdprun or torchrun "
            "--master-port), or the same --rdzv-id to join one",
            address_, run_id);
      }
      if (got == Recv::timed_out)
        FSDP_FAIL(
            "[store] the server at MASTER_ADDR:MASTER_PORT = {} accepted the connection but did "
            "not answer within {} s: is rank 0 stopped, or another program listening on "
            "MASTER_PORT?",
            address_, double(timeout.count()) / 1000.0);
      last_error = "the server closed the connection before answering";  // busy: try again
    }
    throw_if_interrupted(waiting_for);
    if (Clock::now() >= deadline)
      FSDP_FAIL(
          "[store] cannot reach the store at MASTER_ADDR:MASTER_PORT = {} within {} s ({}); check "
          "that rank 0 "
          "is running and that every rank has the same MASTER_ADDR and MASTER_PORT",
          address_, double(timeout.count()) / 1000.0, last_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{time_t(timeout.count() / 1000), suseconds_t((timeout.count() % 1000) * 1000)};
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
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
  // The answer may take the wait's time (get: the store's time-out; wait: its own), and then
  // one more time-out at most; a stop signal ends the wait.
  const auto server_wait = op == kGet    ? timeout_
                           : op == kWait ? std::chrono::milliseconds(std::clamp<int64_t>(
                                               arg, 0, int64_t(24) * 3600 * 1000))
                                         : std::chrono::milliseconds(0);
  const auto deadline = Clock::now() + server_wait + timeout_;
  const std::string what = fmt::format("the rendezvous store at {}{}", address_,
                                       keys.empty() ? std::string() : " (key '" + keys[0] + "')");
  auto tick = [&] { throw_if_interrupted(what); };
  auto read = [&](void* p, size_t n) {
    const Recv r = recv_for(fd_, p, n, deadline, {}, tick);
    FSDP_CHECK(r != Recv::timed_out,
               "[store] the store at {} did not answer request {} within {} s (rank 0 stopped?)",
               address_, int(op), double((server_wait + timeout_).count()) / 1000.0);
    FSDP_CHECK(r == Recv::ok, "[store] lost the connection to {} (rank 0 gone?)", address_);
  };
  uint8_t status;
  uint32_t len;
  read(&status, 1);
  read(&len, 4);
  FSDP_CHECK(status <= 2 && len <= kMaxValue,
             "[store] the server at {} is not an fsdp store (it answered status {} and a length "
             "of {} bytes; at most {} expected)",
             address_, int(status), len, kMaxValue);
  std::vector<char> out(len);
  read(out.data(), len);
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
