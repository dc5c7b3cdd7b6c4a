// How a DTensor lies on one dim of a DeviceMesh, with DTensor's names:
//   Shard(d)     each rank along the mesh dim holds one torch.chunk of tensor dim d
//                (split_factor > 1: _StridedShard, a chunk of what the other dims left)
//   Replicate    each rank holds the whole (along that mesh dim)
//   Partial(op)  each rank holds a partial value; the true value is their sum or average
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

#include "fsdp/distributed/process_group.h"

namespace fsdp::dist {

struct Shard {
  int dim = 0;
  // > 1: PyTorch's _StridedShard, as FSDP2 writes its own Shard(0) after tensor parallel: this
  // mesh dim chunks the piece the other (plain) Shard(dim) mesh dims left, split_factor pieces
  // in all, rather than chunking first, so a rank's rows stay one contiguous range. DTensor's
  // local shapes and full_tensor() know it; redistribute() refuses it.
  int64_t split_factor = 1;
  bool operator==(const Shard& o) const { return dim == o.dim && split_factor == o.split_factor; }
};
struct Replicate {
  bool operator==(const Replicate&) const { return true; }
};
struct Partial {
  ReduceOp op = ReduceOp::SUM;
  bool operator==(const Partial& o) const { return op == o.op; }
};
using Placement = std::variant<Shard, Replicate, Partial>;

std::string placement_str(const Placement& p);
inline bool is_shard(const Placement& p, int dim = -1) {
  auto* s = std::get_if<Shard>(&p);
  return s && (dim < 0 || s->dim == dim);
}

// torch.chunk's split of n elements into `parts`: each chunk has ceil(n / parts)
// elements except the last non-empty one; trailing chunks may be empty.
int64_t chunk_size(int64_t n, int64_t parts);
// [begin, begin + length) of chunk `index`.
std::pair<int64_t, int64_t> chunk_range(int64_t n, int64_t parts, int64_t index);

}  // namespace fsdp::dist
