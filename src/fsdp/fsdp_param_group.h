// FSDPParamGroup (FSDP2's name): the parameters one fully_shard call owns, as
// flat buffers, and the collectives on them. Layouts, with N ranks on the
// shard dim and G the group's padded shard size:
//   sharded        [G]      master dtype: each parameter's rows of chunk r, padded to the largest
//                           chunk (the padding stays zero)
//   all-gather out [N * G]  param_dtype, rank-major: block k is rank k's `sharded`
//   unsharded      [U]      param_dtype: each parameter whole and contiguous (copied out of the
//                           all-gather output: per-parameter shards cannot be strided views of it)
//   unsharded_grad [U]      reduce_dtype, the modules' backward adds into these
//   reduce-scatter in [N * G] reduce_dtype, rank-major (the "chunk-cat" of the grads)
// With one rank and no dtype change there is nothing to gather or reduce, and
// the parameters and gradients are views of the sharded buffers themselves.
// Private to the library.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/fsdp/fully_shard.h"
#include "src/fsdp/fsdp_param.h"

namespace fsdp {

class FSDPCommContext;

// A collective in flight and the buffer it writes.
struct PendingCollective {
  std::shared_ptr<dist::Work> work;
  Tensor out;
};

// FSDP2's ShardedState, with the all-gather in flight as a state of its own: sharded -> (issue)
// unshard_issued -> (wait) unsharded -> (reshard) sharded. A transition the code does not expect
// is an error that names the group and both states.
enum class ShardedState : uint8_t { sharded, unshard_issued, unsharded };
const char* sharded_state_name(ShardedState s);

class FSDPParamGroup {
 public:
  // Lays out `params` over the mesh's shard dim and fills this rank's shards: from the
  // parameters' values where they have them, else from their initialisers (opt.seed).
  // frozen: parameters without gradients (requires_grad false): no gradient buffers, and the
  // backward neither points them at one nor reduces anything.
  FSDPParamGroup(std::vector<FSDPParam> params, std::shared_ptr<dist::DeviceMesh> mesh,
                 const FullyShardOptions& opt, std::string label, bool frozen = false);

  const std::string& label() const { return label_; }
  bool empty() const { return params_.empty(); }
  bool frozen() const { return frozen_; }
  bool packed() const { return packed_; }
  const std::vector<FSDPParam>& params() const { return params_; }
  const Tensor& sharded() const { return sharded_; }
  const Tensor& sharded_grad() const { return sharded_grad_; }  // undefined when frozen
  DType param_dtype() const { return param_dtype_; }
  int shard_count() const { return n_; }
  // The unpadded local shard of one of this group's parameters, a view of sharded().
  Tensor local_shard(const FSDPParam& fp) const;
  // The bytes its all-gathers have written (their outputs: every rank's shard), since it began.
  int64_t gathered_bytes() const { return gathered_bytes_; }
  // The groups of its collectives, to sum their time (null where there are none).
  std::vector<const dist::ProcessGroup*> comm_groups() const;

  // Unshard: issue the all-gather (no-op when unsharded, in flight or direct), then wait for
  // it and point every parameter at its slice of the unsharded buffer.
  void unshard_issue(FSDPCommContext& ctx);
  void unshard_wait(FSDPCommContext& ctx);
  void reshard(FSDPCommContext& ctx);  // frees the unsharded buffer

  // Gradients: before backward, point every parameter's grad at the unsharded gradient buffer;
  // after it, chunk-cat and issue the reduce-scatter (queued in ctx), or keep accumulating
  // while gradient sync is off.
  void prepare_grads();
  void reduce_grads(FSDPCommContext& ctx);
  // After a backward of a module with more backwards to come in this step (a module called
  // twice): the unsharded gradients are kept for the next backward to add into, as without
  // gradient sync; its last backward reduces them once.
  void keep_grads();
  // keep_grads() ran and no reduce_grads() since: a backward of this step is still to come.
  bool awaits_backward() const { return awaits_backward_; }
  // The reduce-scatter's output has arrived: under HSDP, all-reduce it over the replicas (the
  // returned collective); otherwise add it into the sharded gradients.
  std::optional<PendingCollective> finish_reduce_scatter(const Tensor& out);
  // Adds a reduced gradient into the sharded gradients, or writes it there when it is the
  // first since zero_grad.
  void add_into_sharded_grad(const Tensor& reduced);
  // Leaves the sharded gradients to the step's first reduced gradient, which writes them (no
  // zeroing pass, no add to zeros); settle_grad zeroes them where something must add into them
  // (the layers, through direct views) or where no gradient reached them (the root's
  // post-backward settles every group; a group with no root's backward above it this step, a
  // block sharded alone that the step skipped, is settled when the optimizer or a norm reads it,
  // nn::ParamGroup::settle).
  void zero_grad();
  void settle_grad();
  void set_requires_sync(bool sync) { requires_sync_ = sync; }
  ShardedState sharded_state() const { return state_; }

 private:
  void check_shapes_once();
  void init_packed(const FullyShardOptions& opt);
  void decode_packed(const Tensor& blocks);
  void wait_for_all_gather(FSDPCommContext& ctx);
  // Zeroes what no segment writes (the padding of a reduce-scatter's input).
  static void zero_outside(const Tensor& buffer, std::vector<ops::Segment> segments);

  std::vector<FSDPParam> params_;
  std::shared_ptr<dist::DeviceMesh> mesh_;
  std::string label_;
  std::shared_ptr<dist::ProcessGroup> shard_group_, replicate_group_, ag_group_, rs_group_;
  int n_ = 1, rank_ = 0;
  DType master_ = DType::f32, param_dtype_ = DType::f32, reduce_dtype_ = DType::f32;
  int64_t g_ = 0, u_ = 0;  // padded shard and unsharded sizes, in elements
  int64_t gathered_bytes_ = 0;
  Tensor sharded_, sharded_grad_;
  bool frozen_ = false;
  bool packed_ = false;  // frozen parameters kept as their stored bytes (PackedRows)
  double divide_ = 0;    // FullyShardOptions::gradient_divide_factor (0: the mean)
  bool direct_ = false;  // one rank, same dtypes: parameters are views of `sharded`
  // One rank with another compute or reduce dtype: no all-gather or reduce-scatter (nor their
  // copy-in, copy-out and chunk-cat): the shards are cast straight into the compute dtype; the
  // gradients are the shard's own where the reduce dtype is the master's, else accumulated in
  // the reduce dtype in the shards' layout and added (the step's first: written) into them.
  bool one_rank_ = false;
  std::shared_ptr<dist::Work> ag_work_;
  Tensor ag_out_, unsharded_, unsharded_grad_;
  ShardedState state_ = ShardedState::sharded;
  bool grads_kept_ = false, shapes_checked_ = false, requires_sync_ = true;
  bool awaits_backward_ = false;  // keep_grads() since the last reduce_grads()
  bool grad_stale_ = false;  // zero_grad ran and no gradient has been written since
};

}  // namespace fsdp
