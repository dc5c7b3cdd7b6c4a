// all_to_all_v's split-size checks (src/distributed/split_sizes.h).
#include "src/distributed/split_sizes.h"

#include <cstddef>
#include <string_view>

#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"

namespace fsdp::dist {

namespace {

void check_list(const char* op, std::string_view what, int group_size,
                const std::vector<int64_t>& splits, const Tensor& t) {
  FSDP_CHECK(int64_t(splits.size()) == group_size,
             "[{}] {} has {} entries; expected one per rank of this group of {}", op, what,
             splits.size(), group_size);
  int64_t sum = 0;
  for (size_t j = 0; j < splits.size(); ++j) {
    FSDP_CHECK(splits[j] >= 0, "[{}] {}[{}] is {}; split sizes must be >= 0", op, what, j,
               splits[j]);
    sum += splits[j];
  }
  FSDP_CHECK(sum == t.size(0), "[{}] {} sum to {} rows but the tensor {} has {}", op, what, sum,
             shape_str(t.shape()), t.size(0));
}

}  // namespace

SplitLayout check_split_sizes(const char* op, int group_size, const Tensor& out,
                              const std::vector<int64_t>& out_splits, const Tensor& in,
                              const std::vector<int64_t>& in_splits) {
  FSDP_CHECK(in.defined() && out.defined(), "[{}] the {} is undefined", op,
             in.defined() ? "output" : "input");
  FSDP_CHECK(in.dim() >= 1 && out.dim() >= 1,
             "[{}] input {} and output {} need a dim 0 of rows to split", op, shape_str(in.shape()),
             shape_str(out.shape()));
  FSDP_CHECK(in.dtype() == out.dtype(), "[{}] output is {} but input is {}", op,
             dtype_name(out.dtype()), dtype_name(in.dtype()));
  const Shape in_row(in.shape().begin() + 1, in.shape().end());
  const Shape out_row(out.shape().begin() + 1, out.shape().end());
  FSDP_CHECK(in_row == out_row, "[{}] input rows {} and output rows {} differ in shape", op,
             shape_str(in_row), shape_str(out_row));
  check_list(op, "in_splits", group_size, in_splits, in);
  check_list(op, "out_splits", group_size, out_splits, out);
  SplitLayout l;
  l.row_numel = shape_numel(in_row);
  for (int64_t s : in_splits) l.in_counts.push_back(s * l.row_numel);
  for (int64_t s : out_splits) l.out_counts.push_back(s * l.row_numel);
  return l;
}

void check_split_agreement(const char* op, int group_size, const std::vector<int64_t>& all) {
  const size_t n = size_t(group_size);
  FSDP_CHECK(all.size() == 2 * n * n, "[{}] {} split sizes gathered for a group of {}", op,
             all.size(), group_size);
  for (size_t r = 0; r < n; ++r)
    for (size_t j = 0; j < n; ++j) {
      const int64_t sends = all[r * 2 * n + j], expects = all[j * 2 * n + n + r];
      FSDP_CHECK(sends == expects,
                 "[{}] ranks disagree: rank {} sends {} rows to rank {} (its in_splits[{}]) but "
                 "rank {} expects {} from it (its out_splits[{}])",
                 op, r, sends, j, j, j, expects, r);
    }
}

}  // namespace fsdp::dist
