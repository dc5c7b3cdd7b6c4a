// TCPStore's client (the server is store_server.cpp, the wire store_wire.h): each request is one
// message and one response over the connection made at construction, after the hello that
// presents the run id; every wait has a deadline and polls the stop flag, and a reply that is not
// the store's is named by its first bytes.
#include "fsdp/distributed/store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <compare>
#include <cstring>
#include <functional>
#include <ratio>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

#include "fsdp/core/error.h"
#include "fsdp/core/interrupt.h"
#include "src/distributed/store_server.h"
#include "src/distributed/store_wire.h"

namespace fsdp::dist {

using namespace wire;

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
