// The rendezvous store against strangers on its port, over loopback only: a flood of connections
// leaves no thread or memory behind; garbage, a silent connection and a plain request without
// the run's identity are closed at once; a client facing a listener that never answers, or one
// that answers garbage, fails by name within its time-out, and SIGTERM ends its wait.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <csignal>
#include <cstring>
#include <exception>
#include <fstream>
#include <initializer_list>
#include <functional>
#include <sstream>
#include <string>
#include <vector>
#include <thread>

#include <gtest/gtest.h>

#include "fsdp/core/interrupt.h"
#include "fsdp/distributed/store.h"

using fsdp::dist::TCPStore;
using Clock = std::chrono::steady_clock;

namespace {

long status_field(const std::string& name) {  // VmRSS (kB), Threads
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(name + ":", 0) == 0) return std::stol(line.substr(name.size() + 1));
  return -1;
}

int port_of(const TCPStore& s) {
  return std::stoi(s.address().substr(s.address().rfind(':') + 1));
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Seconds until the peer closes fd (recv returns 0 or an error); -1 if still open after limit_s.
double seconds_until_closed(int fd, double limit_s) {
  const auto t0 = Clock::now();
  char buf[256];
  for (;;) {
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > limit_s) return -1;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (::recv(fd, buf, sizeof(buf), 0) <= 0) return s;
  }
}

// A loopback listener that the kernel completes connections on but that never answers
// (accept() only when asked).
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd, 16), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  int accept_one(double limit_s) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, int(limit_s * 1000)) <= 0) return -1;
    return ::accept(fd, nullptr, nullptr);
  }
  ~Listener() { ::close(fd); }
};

struct ChildResult {
  bool exited = false;  // false: still running at the limit (killed)
  int code = -1;
  double seconds = 0;
  std::string message;
};

// Runs fn in a child process (a hang must not hang the test); fn's exception message comes back.
// on_started runs in the parent while the child runs (it may signal the child).
ChildResult run_child(const std::function<void()>& fn, double limit_s,
                      const std::function<void(pid_t)>& on_started = {}) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    int code = 0;
    std::string msg = "returned";
    try {
      fn();
    } catch (const std::exception& e) {
      msg = e.what();
      code = 3;
    }
    (void)!::write(pipe_fds[1], msg.data(), msg.size());
    ::_exit(code);
  }
  ::close(pipe_fds[1]);
  if (on_started) on_started(pid);
  ChildResult r;
  for (;;) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      r.exited = true;
      r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (std::chrono::duration<double>(Clock::now() - t0).count() > limit_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0) r.message.append(buf, size_t(n));
  ::close(pipe_fds[0]);
  return r;
}

}  // namespace

TEST(StoreGuard, AFloodOfConnectionsLeavesNoThreadOrMemory) {
  TCPStore store("127.0.0.1", 0, true, std::chrono::seconds(5), "run-a");
  const int port = port_of(store);
  auto flood = [&](int n) {
    for (int i = 0; i < n; ++i) {
      const int fd = connect_to(port);
      ASSERT_GE(fd, 0);
      linger l{1, 0};  // a reset on close: no TIME_WAIT, the loopback's ports stay free
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
      ::close(fd);
    }
  };
  flood(200);  // warm up the allocator and the thread machinery
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long threads0 = status_field("Threads");
  const long rss0 = status_field("VmRSS");
  flood(20000);
  // The server has let every one of them go (bounded wait, generous: not a speed test).
  long threads = 0;
  for (int i = 0; i < 300 && (threads = status_field("Threads")) > threads0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const long rss1 = status_field("VmRSS");
  std::printf("20000 connections: VmRSS %ld -> %ld kB, threads %ld -> %ld\n", rss0, rss1, threads0,
              threads);
  EXPECT_LE(threads, threads0) << "threads left behind by closed connections";
  EXPECT_LT(rss1 - rss0, 20 * 1024) << "VmRSS grew from " << rss0 << " kB to " << rss1 << " kB";
  // It still serves its own run.
  store.set("k", std::string("v"));
  EXPECT_EQ(store.get_string("k"), "v");
}

// The local addresses (hex, as /proc/net/tcp{,6} spells them) listening on port.
std::vector<std::string> listening_on(int port) {
  std::vector<std::string> out;
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(file);
    std::string line;
    std::getline(f, line);  // the header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, st;
      in >> sl >> local >> remote >> st;
      const size_t colon = local.rfind(':');
      if (st == "0A" && std::stoi(local.substr(colon + 1), nullptr, 16) == port)
        out.push_back(local.substr(0, colon));
    }
  }
  return out;
}

TEST(StoreGuard, ALoopbackStoreListensOnLoopbackOnly) {
  TCPStore store("127.0.0.1", 0, true, std::chrono::seconds(5), "run-a");
  const auto where = listening_on(port_of(store));
  ASSERT_EQ(where.size(), 1u);
  EXPECT_EQ(where[0], "0100007F") << "the store listens beyond loopback";
}

TEST(StoreGuard, StrangersAreClosedAtOnce) {
  TCPStore store("127.0.0.1", 0, true, std::chrono::seconds(30), "run-a");
  const int port = port_of(store);
  {  // an HTTP request
    const int fd = connect_to(port);
    const std::string get = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    ::send(fd, get.data(), get.size(), MSG_NOSIGNAL);
    const double s = seconds_until_closed(fd, 5);
    EXPECT_GE(s, 0) << "garbage kept its connection";
    ::close(fd);
  }
  {  // a connection that says nothing
    const int fd = connect_to(port);
    const double s = seconds_until_closed(fd, 5);
    EXPECT_GE(s, 0) << "a silent connection was kept past 5 s";
    ::close(fd);
  }
  {  // a well-formed set request that does not present the run's identity first
    const int fd = connect_to(port);
    std::string msg;
    auto u32 = [&](uint32_t v) { msg.append(reinterpret_cast<const char*>(&v), 4); };
    msg.push_back(char(1));  // set
    u32(1);
    u32(6);
    msg += "intrud";
    u32(1);
    msg += "x";
    int64_t arg = 0;
    msg.append(reinterpret_cast<const char*>(&arg), 8);
    ::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL);
    const double s = seconds_until_closed(fd, 5);
    EXPECT_GE(s, 0) << "a request without the run's identity kept its connection";
    ::close(fd);
    EXPECT_FALSE(store.check({"intrud"})) << "a stranger's set reached the store";
  }
  {  // another run's client is refused by name
    try {
      TCPStore other("127.0.0.1", port, false, std::chrono::seconds(5), "run-b");
      ADD_FAILURE() << "a client of another run was let in";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("belongs to another run"), std::string::npos)
          << e.what();
      EXPECT_EQ(std::string(e.what()).find("run-a"), std::string::npos)
          << "the refusal told a stranger the run's identity: " << e.what();
    }
  }
  store.set("k", std::string("v"));
  EXPECT_EQ(store.get_string("k"), "v");
}

TEST(StoreGuard, AListenerThatNeverAnswersFailsWithinTheTimeOut) {
  Listener l;
  const auto r = run_child(
      [&] {
        TCPStore s("127.0.0.1", l.port, false, std::chrono::milliseconds(1500), "run-a");
        s.set("k", std::string("v"));
      },
      20);
  ASSERT_TRUE(r.exited) << "the client still waited after 20 s (time-out 1.5 s)";
  EXPECT_EQ(r.code, 3) << r.message;
  EXPECT_LT(r.seconds, 12);
  EXPECT_NE(r.message.find("did not answer"), std::string::npos) << r.message;
}

TEST(StoreGuard, GarbageFromTheServerIsNamedWithBoundedMemory) {
  Listener l;
  std::thread server([&] {
    const int fd = l.accept_one(20);
    if (fd < 0) return;
    const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
    ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 20000) > 0 && ::recv(fd, buf, sizeof(buf), 0) > 0) {
    }
    ::close(fd);
  });
  const auto r = run_child(
      [&] {
        TCPStore s("127.0.0.1", l.port, false, std::chrono::seconds(5), "run-a");
        s.set("k", std::string("v"));
      },
      20);
  ::shutdown(l.fd, SHUT_RDWR);
  server.join();
  ASSERT_TRUE(r.exited) << "the client still waited after 20 s (time-out 5 s)";
  EXPECT_EQ(r.code, 3) << r.message;
  EXPECT_NE(r.message.find("not an fsdp store"), std::string::npos) << r.message;
}

TEST(StoreGuard, SigtermEndsAWaitOnAStalledServer) {
  Listener l;
  int conn = -1;
  const auto r = run_child(
      [&] {
        std::signal(SIGTERM, [](int sig) { fsdp::request_stop(sig); });
        TCPStore s("127.0.0.1", l.port, false, std::chrono::seconds(60), "run-a");
        s.set("k", std::string("v"));
      },
      30,
      [&](pid_t pid) {
        conn = l.accept_one(20);  // the child is connected; a store's first bytes, then silence
        if (conn >= 0) ::send(conn, "FSDP", 4, MSG_NOSIGNAL);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ::kill(pid, SIGTERM);
      });
  if (conn >= 0) ::close(conn);
  ASSERT_TRUE(r.exited) << "SIGTERM did not end the wait (time-out 60 s; killed after 30 s)";
  EXPECT_EQ(r.code, 3) << r.message;
  EXPECT_NE(r.message.find("SIGTERM"), std::string::npos) << r.message;
}
