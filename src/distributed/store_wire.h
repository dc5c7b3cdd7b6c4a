// The TCP store's wire (private to src/distributed: store.cpp is the client, store_server.cpp the
// server). Both directions little-endian:
//   hello    = "FSDPST01" idlen:u32 id      (client, first; id = the run id)
//   welcome  = "FSDPST01" status:u8         (0 ok, 3 another run: then closed)
//   request  = op:u8 nkeys:u32 (len:u32 bytes)* vlen:u32 bytes arg:i64
//   response = status:u8 (0 ok, 1 timed out, 2 refused) len:u32 bytes
// Every length is bounded (the limits below) before it is allocated, on both sides.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace fsdp::dist::wire {

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
inline Recv recv_for(int fd, void* p, size_t n, Clock::time_point deadline,
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

inline bool magic_prefix(const char* c, size_t n) {
  return std::memcmp(c, kMagic, std::min(n, sizeof(kMagic))) == 0;
}

inline bool is_loopback_name(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

inline bool send_all(int fd, const void* p, size_t n) {
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
inline void put(std::vector<char>& b, T v) {
  const char* p = reinterpret_cast<const char*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}
inline void put_bytes(std::vector<char>& b, const char* p, size_t n) {
  put<uint32_t>(b, uint32_t(n));
  b.insert(b.end(), p, p + n);
}


}  // namespace fsdp::dist::wire
