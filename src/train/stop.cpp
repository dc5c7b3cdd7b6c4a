// Preemption (fsdp/train/trainer.h): the first SIGTERM or SIGINT asks the Trainer to stop after
// its step; a second one ends the process. The flag is core/interrupt.h's, the one the step's
// agreement (train_step) and the library's waits read.
#include <unistd.h>

#include <csignal>

#include "fsdp/core/interrupt.h"
#include "fsdp/train/trainer.h"

namespace fsdp::train {

namespace {

extern "C" void on_stop_signal(int sig) {
  const bool second = stop_requested() != 0;
  request_stop(sig);  // the library's waits (store, collectives) give up once a step had its time
  if (second) {  // leave now
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

}  // namespace fsdp::train
