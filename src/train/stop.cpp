// Preemption (fsdp/train/trainer.h): the first SIGTERM or SIGINT asks the Trainer to stop after
// its step; a second one ends the process.
#include <unistd.h>

#include <atomic>
#include <csignal>

#include "fsdp/core/interrupt.h"
#include "fsdp/train/trainer.h"

namespace fsdp::train {

namespace {

std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) {
  request_stop(sig);  // the library's waits (store, collectives) give up once a step had its time
  if (g_stop_signal.exchange(sig) != 0) {  // the second one: leave now
    const char msg[] = "fsdp-train: second stop signal: exiting without a checkpoint\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    _exit(128 + sig);
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int stop_signal() { return g_stop_signal.load(); }

}  // namespace fsdp::train
