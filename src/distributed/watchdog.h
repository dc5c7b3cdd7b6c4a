// What a rank knows when a collective times out, and what it does then.
//   - Every CPU process group numbers its collectives (issued, done) under its label.
//   - The progress board: with a TCP store (torchrun-style launch, and one that rank 0 serves
//     for the board under mpirun), a thread posts this rank's counters every second. After a
//     time-out the waiting rank reads every rank's post and names the late ones: a rank whose
//     post is stale (stopped or hung) or whose count on that group is behind.
//   - A time-out abandons the communication threads: one stuck inside MPI or Gloo can never be
//     joined nor safely freed under it. The error is thrown to the caller; the first group
//     destroyed after it (unwinding reaches one soon) prints the error and ends the job
//     (abort_process: MPI_Abort under mpirun), as PyTorch's NCCL watchdog tears a process down.
// Process-wide by nature: it describes this process's ranks. Private to the library.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace fsdp::dist {

class TCPStore;

namespace watchdog {

struct Counter {
  std::string label;
  std::atomic<int64_t> issued{0}, done{0};
};
// A group's counter, posted on the board while the group lives.
std::shared_ptr<Counter> register_group(const std::string& label);
// Renames it ("group3" -> "group3-all-gather"), under the board's lock.
void relabel(Counter& c, const std::string& label);
std::string label_of(const Counter& c);

// Starts (or restarts) the board for this rank; size 1 or a null store: no board.
void start_board(std::shared_ptr<TCPStore> store, int rank, int size);
void stop_board();

// After collective #seq on `label` timed out, or failed in the engine (`peer_failed`: a peer's
// connection broke): the late ranks, in words ("" without a board). Bounded: a board whose
// server (rank 0) does not answer within 5 s is said to be silent; after a peer failure a board
// that shows everyone alive is read once more when a dead rank's post is stale (about 3.5 s).
std::string describe_late_ranks(const std::string& label, int64_t seq, bool peer_failed = false);

void abandon(const std::string& error);
bool abandoned();
const std::string& abandon_error();

}  // namespace watchdog
}  // namespace fsdp::dist
