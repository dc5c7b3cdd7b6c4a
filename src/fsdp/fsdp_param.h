// FSDPParam (FSDP2's name): one parameter's place in its group's flat buffers.
// A parameter is chunked on dim 0 over the N ranks of the shard dim, each
// chunk padded to the largest one (dist::chunk_size), so rank k's chunk of
// every parameter sits at the same offset of block k of a rank-major buffer.
// Private to the library.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/distributed/dtensor.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/module.h"
#include "fsdp/ops/ops.h"

namespace fsdp {

struct FSDPParam {
  std::string name;
  nn::Parameter* param = nullptr;
  int64_t dim0 = 0, row = 0;  // rows FSDP shards (the parameter's, as it lies) and elements per row
  // Where the parameter's rows sit in its global tensor (a placement's Shard(0) on another mesh
  // dim: nn::Parameter::placement): global_offset + local_begin is this shard's first global row.
  Shape global_shape;
  int64_t global_offset = 0;
  // The parameter's placement (null: whole) and the dim of its mesh that fully_shard's shards lie
  // on (its group is fully_shard's shard group).
  std::shared_ptr<const dist::ParameterPlacement> placement;
  int fsdp_dim = -1;
  int64_t padded_rows = 0;    // rows of the largest chunk
  int64_t local_begin = 0, local_rows = 0;
  int64_t shard_offset = 0;      // in the sharded buffer (and in each block of a rank-major one)
  int64_t unsharded_offset = 0;  // in the unsharded buffer: a multiple of kAlignElems
  // Packed (FullyShardOptions::frozen_packed): the shard is bytes, shard_offset counts bytes of
  // the group's buffer, and each rank's chunk takes padded_bytes of it.
  std::optional<PackedRows> packed;
  int64_t padded_bytes = 0, local_bytes = 0;

  // Every parameter (and its gradient) starts at a multiple of kAlignElems elements of the
  // unsharded buffers, so at least 32 bytes for 2-byte dtypes and 64 for f32: cuBLASLt's
  // vectorised kernels and the bias epilogues need 16-byte-aligned operands, and a weight or
  // bias at an odd offset would otherwise get a slow kernel, or none.
  static constexpr int64_t kAlignElems = nn::kFlatAlignElems;

  // Lays the parameter out for `rank` of `n` after the `sharded` and `unsharded` elements
  // already placed (the unsharded offset, and at n = 1 the shard's, rounded up to
  // kAlignElems), and grows both by its padded shard and its whole size.
  void place(int n, int rank, int64_t& sharded, int64_t& unsharded);
  // The same for a packed parameter: `sharded` counts bytes (each shard 16-byte aligned).
  void place_packed(int n, int rank, int64_t& sharded_bytes, int64_t& unsharded);
  int64_t numel() const { return dim0 * row; }
  // Every rank's rows between the unsharded buffer and a rank-major buffer of n blocks of
  // `block` elements: from the blocks into the unsharded buffer (the all-gather's copy-out), or
  // the other way (the reduce-scatter's chunk-cat).
  enum class Direction { blocks_to_unsharded, unsharded_to_blocks };
  void segments(int n, int64_t block, Direction d, std::vector<ops::Segment>& out) const;
};

}  // namespace fsdp
