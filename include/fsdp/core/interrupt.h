// A stop request (SIGTERM, SIGINT) that the library's long waits give up on. A binary's signal
// handler calls request_stop(sig) (async-signal-safe); the rendezvous store's waits and
// Work::wait poll throw_if_interrupted(), which throws fsdp::Error naming the signal and the wait
// once the stop has been pending for the grace: 1 s by default, or what the caller sets (the
// trainer lets a step in flight finish, so that the run still checkpoints after it). Within an
// Uninterruptible scope (a checkpoint being written after the stop) waits are not interrupted; a
// second signal ends the process there.
#pragma once

#include <chrono>
#include <string_view>

namespace fsdp {

void request_stop(int sig) noexcept;
int stop_requested() noexcept;
void set_stop_grace(std::chrono::milliseconds grace);
void throw_if_interrupted(std::string_view what);

class Uninterruptible {
 public:
  Uninterruptible();
  ~Uninterruptible();
  Uninterruptible(const Uninterruptible&) = delete;
  Uninterruptible& operator=(const Uninterruptible&) = delete;
};

}  // namespace fsdp
