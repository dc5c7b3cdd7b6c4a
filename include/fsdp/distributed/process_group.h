// ProcessGroup: the collectives of a set of ranks, the engines behind them
// (Open MPI and Gloo for CPU tensors, NCCL for CUDA tensors), and nothing of
// our own on the wire.
//
// Every call is asynchronous: it is checked, enqueued in issue order on the
// group's communication stream and returns a Work. On CPU that stream is a
// worker thread per group (CpuStream), so compute goes on while a collective
// is in flight; on CUDA it is a high-priority CUDA stream ordered by events.
// Work::wait() blocks the caller (CPU) or makes the current stream wait
// (CUDA); it throws, naming the collective, if the work does not complete
// within the collective time-out (FSDP_COLLECTIVE_TIMEOUT_S), so a dead or
// stuck peer becomes an error instead of a hang.
//
// dtypes: f32, f64, bf16, f16, i32, i64. Engines without bf16/f16 reductions
// reduce in f32. AVG is SUM then a division, floating dtypes only.
// With FSDP_DIST_CHECK=1 (the default) each collective first compares its
// kind, dtype and sizes across ranks and names the ranks that disagree.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fsdp/core/stream.h"
#include "fsdp/core/tensor.h"

namespace fsdp::dist {

enum class ReduceOp : uint8_t { SUM, AVG };
std::string_view reduce_op_name(ReduceOp op);

class Work {
 public:
  virtual ~Work() = default;
  // Waits for completion (see the file comment); rethrows the collective's error.
  virtual void wait() = 0;
  virtual bool is_completed() const = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "gloo", "nccl" or "local"
  virtual Device device() const = 0;        // where its tensors must live

  // out [size * n, ...] = concatenation over ranks of in [n, ...] (dim 0).
  virtual std::shared_ptr<Work> all_gather_into_tensor(const Tensor& out, const Tensor& in) = 0;
  // in [size * n, ...] is reduced across ranks; rank r keeps rows [r*n, (r+1)*n) in out [n, ...].
  virtual std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& out, const Tensor& in,
                                                      ReduceOp op) = 0;
  virtual std::shared_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> broadcast(const Tensor& t, int root) = 0;
  // Rank r sends rows [j*n, (j+1)*n) of in to rank j and receives rank j's block r into out rows
  // [j*n, (j+1)*n).
  virtual std::shared_ptr<Work> all_to_all_single(const Tensor& out, const Tensor& in) = 0;
  // All-to-all with split sizes in rows of dim 0 (torch.distributed.all_to_all_single with
  // input_split_sizes and output_split_sizes): rank r sends in's rows
  // [sum(in_splits[:j]), +in_splits[j]) to rank j and receives rank j's block for r into out's
  // rows [sum(out_splits[:j]), +out_splits[j]). Each list has one non-negative entry per rank and
  // sums to its tensor's rows; in and out share dtype and row shape. out_splits[j] on rank r must
  // equal in_splits[r] on rank j (checked across ranks with FSDP_DIST_CHECK=1).
  virtual std::shared_ptr<Work> all_to_all_v(const Tensor& out,
                                             const std::vector<int64_t>& out_splits,
                                             const Tensor& in,
                                             const std::vector<int64_t>& in_splits) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  // MPI_Comm_split: ranks with the same color form a group, ordered by key.
  // Collective over this group; a negative color returns nullptr.
  virtual std::shared_ptr<ProcessGroup> split(int color, int key) = 0;

  // The thread that runs this group's collectives on CPU (for ordering tests
  // and the profiler); the default thread id for CUDA groups.
  virtual std::thread::id comm_thread_id() const { return {}; }
  // Seconds this group's communication thread has spent in collectives (CPU
  // groups; 0 where the engine runs on a device stream).
  virtual double comm_seconds() const { return 0.0; }
  // Names the group's communication thread in traces ("all-gather").
  virtual void set_label(const std::string&) {}
};

// The collective time-out from FSDP_COLLECTIVE_TIMEOUT_S.
std::chrono::milliseconds collective_timeout();

}  // namespace fsdp::dist
