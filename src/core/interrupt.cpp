#include "fsdp/core/interrupt.h"

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "fsdp/core/error.h"

namespace fsdp {

namespace {

std::atomic<int> g_sig{0};
std::atomic<int64_t> g_at_ns{0};            // CLOCK_MONOTONIC at the first request
std::atomic<int64_t> g_grace_ms{1000};
std::atomic<int> g_uninterruptible{0};

int64_t mono_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

const char* sig_name(int sig) {
  return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a stop signal";
}

}  // namespace

void request_stop(int sig) noexcept {
  int expected = 0;
  if (g_sig.compare_exchange_strong(expected, sig)) g_at_ns.store(mono_ns());
}

int stop_requested() noexcept { return g_sig.load(); }

void set_stop_grace(std::chrono::milliseconds grace) {
  g_grace_ms.store(std::max<int64_t>(0, grace.count()));
}

void throw_if_interrupted(std::string_view what) {
  const int sig = g_sig.load();
  if (sig == 0 || g_uninterruptible.load() > 0) return;
  const int64_t pending_ms = (mono_ns() - g_at_ns.load()) / 1000000;
  if (pending_ms < g_grace_ms.load()) return;
  FSDP_FAIL("[interrupt] {} received: gave up waiting for {} ({:.1f} s after the signal)",
            sig_name(sig), what, double(pending_ms) / 1000.0);
}

Uninterruptible::Uninterruptible() { g_uninterruptible.fetch_add(1); }
Uninterruptible::~Uninterruptible() { g_uninterruptible.fetch_sub(1); }

}  // namespace fsdp
