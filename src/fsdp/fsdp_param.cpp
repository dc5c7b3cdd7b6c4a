#include "src/fsdp/fsdp_param.h"

#include <tuple>

#include "fsdp/distributed/placement.h"

namespace fsdp {

namespace {
int64_t align_up(int64_t x) {
  return (x + FSDPParam::kAlignElems - 1) / FSDPParam::kAlignElems * FSDPParam::kAlignElems;
}
}  // namespace

void FSDPParam::place(int n, int rank, int64_t& sharded, int64_t& unsharded) {
  dim0 = param->shape[0];
  row = dim0 ? shape_numel(param->shape) / dim0 : 0;
  padded_rows = dist::chunk_size(dim0, n);
  std::tie(local_begin, local_rows) = dist::chunk_range(dim0, n, rank);
  // At one rank the shard is the whole parameter, and the group may hand it out as the
  // parameter itself (no all-gather): aligned like the unsharded buffer. At more ranks the
  // shards stay packed (the persistent bytes are the padded shards, nothing more).
  if (n == 1) sharded = align_up(sharded);
  shard_offset = sharded;
  sharded += padded_rows * row;
  unsharded_offset = unsharded = align_up(unsharded);
  unsharded += numel();
}

void FSDPParam::place_packed(int n, int rank, int64_t& sharded_bytes, int64_t& unsharded) {
  dim0 = param->shape[0];
  row = dim0 ? shape_numel(param->shape) / dim0 : 0;
  padded_rows = dist::chunk_size(dim0, n);
  std::tie(local_begin, local_rows) = dist::chunk_range(dim0, n, rank);
  padded_bytes = packed->padded_chunk_bytes(n);
  local_bytes = packed->bytes(local_begin, local_begin + local_rows);
  shard_offset = sharded_bytes;
  sharded_bytes += padded_bytes;
  unsharded_offset = unsharded = align_up(unsharded);
  unsharded += numel();
}

void FSDPParam::segments(int n, int64_t block, Direction d, std::vector<ops::Segment>& out) const {
  for (int k = 0; k < n; ++k) {
    auto [b, len] = dist::chunk_range(dim0, n, k);
    if (len == 0) continue;
    const int64_t in_blocks = int64_t(k) * block + shard_offset,
                  in_unsharded = unsharded_offset + b * row;
    if (d == Direction::blocks_to_unsharded)
      out.push_back({in_unsharded, in_blocks, len * row});
    else
      out.push_back({in_blocks, in_unsharded, len * row});
  }
}

}  // namespace fsdp
