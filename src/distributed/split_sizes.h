// The split sizes of all_to_all_v (fsdp/distributed/process_group.h), checked in one place for
// every engine, so a bad list fails the same way on MPI, Gloo, NCCL and the meta group: before
// anything is queued, naming the list, the rank and the value.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/core/tensor.h"

namespace fsdp::dist {

struct SplitLayout {
  int64_t row_numel = 0;                       // elements per row (the product of dims 1..)
  std::vector<int64_t> in_counts, out_counts;  // elements per rank
};

// Checks one all_to_all_v call on this rank: both tensors defined, of one dtype, at least 1-D,
// with the same row shape; each split list has `group_size` non-negative entries that sum to its
// tensor's rows. Throws "[op] ..." naming what is wrong.
SplitLayout check_split_sizes(const char* op, int group_size, const Tensor& out,
                              const std::vector<int64_t>& out_splits, const Tensor& in,
                              const std::vector<int64_t>& in_splits);

// Given every rank's (in_splits, out_splits), rank-major as [rank][0..n) in then [rank][n..2n)
// out, checks that what each rank sends each other one is what that one expects. The same on
// every rank, so all of them throw together, naming the first pair that disagrees.
void check_split_agreement(const char* op, int group_size, const std::vector<int64_t>& all);

}  // namespace fsdp::dist
