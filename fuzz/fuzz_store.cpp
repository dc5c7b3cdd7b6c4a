// The TCP store's messages from outside (a port scanner, another job's rank), over loopback
// only: the server must answer or drop the connection, and never end the process. An input whose
// first byte is odd is sent after a valid hello (this run's id, ""), so that the requests past
// the hello are fuzzed too; an even one is sent raw (the hello itself is fuzzed).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/distributed/store.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One server for the run, on a free loopback port; a short time-out so a get of a missing key
  // does not hold its thread long.
  static auto* store =
      new fsdp::dist::TCPStore("127.0.0.1", 0, true, std::chrono::milliseconds(50));
  static const int port = std::stoi(store->address().substr(store->address().rfind(':') + 1));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    if (size > 0 && (data[0] & 1)) {
      const char hello[12] = {'F', 'S', 'D', 'P', 'S', 'T', '0', '1', 0, 0, 0, 0};
      (void)!::send(fd, hello, sizeof(hello), MSG_NOSIGNAL);
      ++data;
      --size;
    }
    (void)!::send(fd, data, size, MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 100) > 0 && ::recv(fd, buf, sizeof(buf), 0) > 0) {
    }
  }
  ::close(fd);
  // The store still serves: a round trip of our own.
  store->set("fuzz/alive", std::string("1"));
  if (store->get_string("fuzz/alive") != "1") __builtin_trap();
  return 0;
}
