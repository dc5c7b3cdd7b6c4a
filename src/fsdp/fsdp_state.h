// FSDPState (FSDP2's name): what fully_shard attaches to one module: its
// FSDPParamGroup, its options and the hooks' logic. A root state (the
// outermost one a forward enters) also holds the FSDPRootContext: every state
// under it, the orders of one iteration (for implicit prefetch) and the
// FSDPCommContext (the reduce-scatters in flight, the time the compute thread
// waited for collectives, the event log). Nothing here is process-global: two
// sharded models in one process keep separate counters.
//
// Streams and events on CUDA (NCCL), as this code runs today:
//   compute stream (one per device, cuda_compute_stream): every kernel,
//     including the copy-in to param_dtype, the copy-out of the all-gather
//     output and the reduce-scatter chunk-cat;
//   the all-gather group's NCCL stream and the reduce-scatter group's NCCL
//     stream (fully_shard gives each its own communicator, so the two overlap
//     each other and the compute);
//   a collective first waits on an event recorded on the compute stream at
//     issue (its input is ready), and Work::wait() makes the compute stream
//     wait on an event recorded after it on its NCCL stream; the host never
//     blocks (only the step's loss read does);
//   buffers: a Work keeps its tensors alive until it is waited on, and a
//     freed block returns to the compute stream's pool, whose later users are
//     ordered after that wait: a block cannot be reused while NCCL still
//     reads or writes it.
// So the next group's all-gather runs under this group's compute, and the
// reduce-scatter of group i under the backward of group i - 1. Unlike FSDP2,
// the copy-out runs on the compute stream rather than the all-gather stream:
// it is a memory-bound kernel of the unsharded size (fsdp-bench-kernels times
// it against its floor). On CPU groups (MPI, Gloo) the communication threads
// play the streams and Work::wait() blocks the host instead.
// Private to the library.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/fsdp/fully_shard.h"
#include "src/fsdp/fsdp_param_group.h"

namespace fsdp {

class FSDPCommContext {
 public:
  // Waits for a collective and counts the time as exposed communication.
  void wait(const std::shared_ptr<dist::Work>& w);
  double exposed_seconds() const { return double(exposed_ns_.load()) * 1e-9; }

  // Queues a group's reduce-scatter; at most one stays queued behind it (the one issued by the
  // previous group is finished now, while this group's runs during the next group's backward:
  // FSDP2 frees its reduce-scatter buffers the same way).
  void queue_reduce_scatter(FSDPParamGroup* group, PendingCollective rs);
  // End of backward: every reduce-scatter and HSDP all-reduce finished and added in.
  void finish_backward();

  void log(const char* what, const std::string& label);
  void set_log(bool on);
  std::vector<std::string> take_log();

 private:
  void complete_oldest_reduce();

  std::deque<std::pair<FSDPParamGroup*, PendingCollective>> rs_inflight_;
  std::vector<std::pair<FSDPParamGroup*, PendingCollective>> replica_inflight_;  // HSDP
  std::atomic<int64_t> exposed_ns_{0};
  std::mutex log_mu_;
  bool log_on_ = false;
  std::vector<std::string> log_;
};

struct FSDPState;

struct FSDPRootContext {
  std::vector<FSDPState*> states;  // every state under the root, in tree order, the root first
  std::vector<FSDPState*> fwd_order, prev_fwd_order, post_fwd_order;
  FSDPCommContext comm;
};

// FSDP2's TrainingState of one fully_shard module: idle -> forward -> idle, and
// idle -> pre_backward -> idle (pre_backward lasts through the module's backward). A hook in a
// state it does not expect is an error naming the module and both states; the one that matters
// is a forward hook during the module's own backward, which an activation recompute through
// forward() instead of forward_impl() would make (a second all-gather of the same block).
enum class TrainingState : uint8_t { idle, forward, pre_backward };
const char* training_state_name(TrainingState s);

struct FSDPState {
  FSDPState(nn::Module& module, std::shared_ptr<dist::DeviceMesh> mesh,
            const FullyShardOptions& opt, std::vector<FSDPParam> params);

  nn::Module* module;
  std::shared_ptr<dist::DeviceMesh> mesh;
  FullyShardOptions opt;
  std::string label;  // the module's path ("<root>" for the top)
  // The module's parameter groups: the trainable one (always, perhaps empty), then the frozen
  // parameters' (requires_grad false, a LoRA base) where there are any: gathered like the other,
  // never given gradients, never reduced; then the packed frozen ones' (opt.frozen_packed, a
  // quantized base), gathered as bytes and decoded. Fixed at construction (FSDPCommContext points
  // at them).
  std::vector<FSDPParamGroup> groups;
  bool reshard_after_forward, reshard_after_backward = true;
  bool explicit_fwd = false, explicit_bwd = false;
  std::vector<FSDPState*> fwd_prefetch, bwd_prefetch;
  FSDPState* root = nullptr;
  std::unique_ptr<FSDPRootContext> root_ctx;  // roots only
  TrainingState training_state = TrainingState::idle;

  // The root's comm context; a state used before any forward becomes its own root.
  FSDPCommContext& comm();
  // Makes this the root of every state in its subtree.
  void lazy_init_root();
  bool is_root() const { return root == this; }

  // Every group of this state: issue its all-gather, wait for it, free it.
  void unshard_issue(FSDPCommContext& c);
  void unshard_wait(FSDPCommContext& c);
  void reshard(FSDPCommContext& c);
  FSDPParamGroup& trainable() { return groups.front(); }

  Tensor pre_forward(const Tensor& x);
  Tensor post_forward(const Tensor& y);
  void pre_backward();
  void post_backward();

 private:
  std::vector<FSDPState*> forward_prefetch_targets() const;
  std::vector<FSDPState*> backward_prefetch_targets() const;
};

}  // namespace fsdp
