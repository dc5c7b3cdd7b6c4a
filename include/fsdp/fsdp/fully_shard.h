// fully_shard: FSDP2's per-parameter sharding for fsdp.cpp modules.
//
//   for (auto& block : model.layers()) fsdp::fully_shard(block, mesh);
//   fsdp::FSDPModule& root = fsdp::fully_shard(model, mesh);
//   optim::AdamW opt(root.param_groups(0.01), {.lr = 3e-4});
//   root.zero_grad(); loss = model.forward(...); model.backward(...); opt.step();
//
// Each call forms one communication group from the module's parameters that
// no inner call already owns, applied bottom-up. Every parameter becomes a
// Shard(0) DTensor over the mesh (the last mesh dim; a 2-D mesh is HSDP,
// (replicate, shard)), chunked as torch.chunk does, each local shard padded
// to the largest chunk. Parameters are created directly as shards: the
// values depend only on (seed, dotted name, element index), so every world
// size gives the same model. A module whose parameters already hold values
// is sharded from them instead.
//
// At run time, through the module's hooks (a link of its chain; a user's hooks may sit beside
// them and see or replace the gradients: nn::ModuleHooks):
//   pre-forward    all-gather the group in param_dtype into one flat buffer
//                  (on the all-gather group's thread), copy out per-parameter
//                  tensors, and issue the next group's all-gather (prefetch);
//   post-forward   free the unsharded parameters (reshard_after_forward; the
//                  root keeps them);
//   pre-backward   unshard again (prefetched by the group after it) and
//                  prefetch the group before it in post-forward order;
//   post-backward  lay the gradients out rank-major in reduce_dtype, issue an
//                  AVG reduce-scatter (on the reduce-scatter group's thread),
//                  then finish the one issued by the group before (it ran
//                  during this group's backward) and add it into the sharded
//                  grads; free the unsharded parameters and gradients;
//   root end of backward: finish the last reduce-scatter (and, for HSDP, the
//                  all-reduces over replicas).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/dtensor.h"
#include "fsdp/fsdp/data_parallel.h"
#include "fsdp/nn/module.h"
#include "fsdp/nn/param_group.h"

namespace fsdp {

struct MixedPrecisionPolicy {
  std::optional<DType>
      param_dtype;  // all-gather and compute dtype; unset: the sharded parameters' dtype
  std::optional<DType> reduce_dtype;  // gradient reduce-scatter dtype; unset: param_dtype's
  std::optional<DType> output_dtype;  // cast the module's floating output to it; unset: leave it
};

// A frozen parameter kept packed rather than in a float dtype (QLoRA: a GGUF base's own quantized
// blocks as the sharded storage). Its rows of dim 0 are bytes, in runs of rows that share a
// format and a byte length; `decode` turns whole rows of a format into f32. A shard is whole
// rows, so it is a byte range, all-gathered as those bytes and decoded row by row just before
// use (into the group's compute dtype). CPU only.
struct PackedRows {
  struct Run {
    int64_t rows = 0, row_bytes = 0;
    uint32_t format = 0;  // passed to decode (a ggml type, for GGUF)
  };
  std::vector<Run> runs;
  std::function<void(uint32_t format, const uint8_t* src, float* dst, int64_t elems)> decode;
  int64_t rows() const;
  int64_t bytes(int64_t row_begin, int64_t row_end) const;  // of rows [begin, end)
  // The largest of the n chunks' bytes (torch.chunk's split of the rows), rounded up to 16:
  // what each rank's shard of it takes.
  int64_t padded_chunk_bytes(int n) const;
};

struct FullyShardOptions {
  bool reshard_after_forward =
      true;  // false: keep the parameters from forward to backward (ZeRO-2 style)
  MixedPrecisionPolicy mp_policy;
  DType init_dtype = DType::f32;  // dtype of the sharded (master) parameters created here
  uint64_t seed = 0;              // initialisation seed of the parameters created here
  // The sharded dtype of the frozen parameters created here (requires_grad false: a LoRA base in
  // bf16 beside f32 adapters); unset: init_dtype. Give mp_policy.param_dtype alike.
  std::optional<DType> frozen_dtype;
  // Frozen parameters to keep packed, by full name (nullopt: the others, as frozen_dtype). They
  // form a group of their own, filled by the caller through shard_infos() (no initialiser runs).
  std::function<std::optional<PackedRows>(const std::string& name)> frozen_packed;
  // > 0: the reduce-scatter sums the gradients and divides by this in place of averaging over
  // the shard group (torchtitan's gradient_divide_factor). Expert parallel's experts, sharded
  // over dp_shard_mod_ep, whose gradient on each rank already sums its ep group's tokens, divide
  // by the world size, so that their gradient is one rank's over the global batch. A group with
  // a factor always reduces, even over one rank. (A tensor-parallel weight needs none: each tp
  // rank's gradient of its rows is already the whole gradient of those rows for its dp rank's
  // batch, so the mean over the shard group, dp, is right.)
  double gradient_divide_factor = 0;
};

struct FSDPState;  // the runtime (src/fsdp/fsdp_state.h)

// The state fully_shard attaches to a module; the FSDP2 methods live here. The step's methods
// are DataParallelModule's (data_parallel.h), which replicate() implements too.
class FSDPModule : public DataParallelModule {
 public:
  ~FSDPModule() override;

  // All-gathers this module's parameters now; async returns before they arrive.
  std::shared_ptr<UnshardHandle> unshard(bool async = false) override;
  void reshard() override;
  // false: backward keeps the unsharded gradients (reduce_dtype) and
  // accumulates; the next backward with true reduces them. Applies to every
  // FSDP module under this one.
  void set_requires_gradient_sync(bool sync) override;
  void set_reshard_after_backward(bool reshard);
  void set_reshard_after_forward(bool reshard);
  void set_modules_to_forward_prefetch(const std::vector<FSDPModule*>& modules);
  void set_modules_to_backward_prefetch(const std::vector<FSDPModule*>& modules);

  // The sharded parameters and gradients of every FSDP module under this one,
  // one flat buffer pair per group, for the optimizer. A module's frozen parameters
  // (requires_grad false: a LoRA base) form a group of their own, gathered like the others but
  // never reduced, whose `grads` is undefined (AdamW keeps no state for it, clipping skips it).
  // decay_1d = false: 1-D parameters (norms, biases) get no weight decay.
  std::vector<nn::ParamGroup> param_groups(double weight_decay, bool decay_1d = true) override;
  // Clears the sharded gradients of every FSDP module under this one (module().zero_grad()
  // does the same), lazily, as PyTorch's set_to_none: the next backward's first gradient is
  // written over them rather than added to zeros, and the root's post-backward zeroes those no
  // gradient reached. Between the two they still hold the last step's values (optim's
  // Optimizer::zero_grad() zeroes at once).
  void zero_grad() override;
  // Parameter name -> its Shard(0) DTensor (the unpadded local shard) over fully_shard's mesh. A
  // packed frozen parameter (FullyShardOptions::frozen_packed), whose shard is bytes, is left out.
  // A parameter that carries a placement (nn::Parameter::placement) is a DTensor of its global
  // shape on its own mesh, with the composed placements (ShardInfo::placements), so full_tensor()
  // is the global tensor.
  std::vector<std::pair<std::string, dist::DTensor>> sharded_parameters();
  // Where each parameter's local shard lives, in named_parameters() order:
  // `group` indexes param_groups() (and so the optimizer's state), `offset`
  // is the shard's start in that group's flat buffer.
  struct ShardInfo {
    std::string name;
    Shape global_shape;                       // the global tensor's (nn::Parameter::global_shape)
    int64_t local_begin = 0, local_rows = 0;  // rows of dim 0 this rank holds, in global rows
    size_t group = 0;
    int64_t offset = 0;
    // A packed parameter (FullyShardOptions::frozen_packed): `offset` is in bytes of the group's
    // buffer, and its shard is `packed_bytes` bytes, this rank's rows as stored.
    bool packed = false;
    int64_t packed_bytes = 0;
    // The composed placements, one per dim of `mesh`: fully_shard's mesh ([Replicate,] Shard(0))
    // for a whole parameter; the parameter's own mesh for one that carries a placement, with
    // fully_shard's Shard(0) on fsdp_dim, strided (split_factor: the pieces the other dims'
    // Shard(0) made; PyTorch's _StridedShard, as FSDP2 after tensor parallel): FSDP chunks the
    // rows those dims left this rank, which is why local_begin is one contiguous range.
    std::shared_ptr<dist::DeviceMesh> mesh;
    std::vector<dist::Placement> placements;
    int fsdp_dim = 0;
  };
  std::vector<ShardInfo> shard_infos();
  // This rank's place on the shard dim, and whether it is the first replica (HSDP).
  int shard_rank() const;
  int shard_count() const;
  bool first_replica() const;
  // fully_shard's mesh.
  const std::shared_ptr<dist::DeviceMesh>& mesh() const;
  // The group of the mesh's shard dim (the last), over which the shards of a parameter lie.
  std::shared_ptr<dist::ProcessGroup> shard_group() const override;

  // Bytes this rank holds for sharded parameters and gradients (padding included).
  int64_t sharded_bytes() const;
  // Cumulative seconds: spent in this mesh's all-gathers and reduce-scatters
  // on their threads, and spent by the compute thread waiting for them (the
  // communication that compute did not hide).
  CommStats comm_stats() const override;

  // An ordered log of this root's FSDP events ("ag_issue:layers.1", "fwd_end:layers.0",
  // "rs_issue:layers.2", "rs_wait:layers.2", ...) for tests and debugging. Call on the root.
  void set_event_log(bool on);
  std::vector<std::string> take_event_log();

  FSDPState& state() const { return *impl_; }
  explicit FSDPModule(std::unique_ptr<FSDPState> state);

  Tensor pre_forward(nn::Module&, const Tensor& x) override;
  Tensor post_forward(nn::Module&, const Tensor& y) override;
  // Pass the gradients through unchanged.
  Tensor pre_backward(nn::Module&, const Tensor& dy) override;
  Tensor post_backward(nn::Module&, const Tensor& dx) override;

 private:
  std::unique_ptr<FSDPState> impl_;
};

// Shards `module`'s parameters that no inner fully_shard owns, installing its hooks in the
// module's chain beside any others (a user's: nn::ModuleHooks gives the order they run in).
// A parameter that carries a placement (dist::distribute_parameter: tensor parallel's Shard(0) on
// a "tp" dim, expert parallel's on "ep") is sharded on top of it: `mesh` must be 1-D and be one of
// the parameter mesh's dims (mesh["dp"]: the same group) on which it is Replicate(), and every
// other dim must hold it as Shard(0) or Replicate(); FSDP then chunks the rows this rank holds.
// Shard(d) with d != 0 and Partial are refused, naming the parameter and the placement.
// Refused, by name, on a module sharded already, or replicated (replicate()), or inside or
// holding a replicated one.
FSDPModule& fully_shard(nn::Module& module, std::shared_ptr<dist::DeviceMesh> mesh,
                        FullyShardOptions options = {});
// The FSDP state of a module, or nullptr.
FSDPModule* fsdp_state(const nn::Module& module);

}  // namespace fsdp
