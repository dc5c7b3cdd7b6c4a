// Expert parallel's token exchange: dispatch sends each row to the rank that holds its expert, and
// combine brings the results back, as one differentiable op on Tensor + counts (no nn: the MoE
// layer calls it between its permutation and its expert GEMMs).
//
// The ep group's rank j holds the global experts [j * L, (j + 1) * L), L = num_experts / ep size
// (local_experts). A rank's input rows are already permuted so that each global expert's rows are
// contiguous, in expert order, with counts[e] rows for expert e. Dispatch first exchanges the
// counts (one all_to_all_single of num_experts i64 on the host), then the rows (all_to_all_v).
//
// Order of the received rows: the all-to-all delivers them by (source rank, local expert);
// dispatch regroups them to (local expert, source rank), so each local expert's rows are
// contiguous (one GEMM per expert) and, within an expert, come in source rank order: the order
// a one-rank run over the ep group's rows concatenated rank by rank would give that expert.
// combine undoes the regrouping and the exchange, returning rows in the caller's original order.
//
// Both are pure permutations of rows (exact in any dtype), and each one's backward is the other
// on the gradients. The exchange runs on the group's communication thread or stream (pass a
// DeviceMesh::stream_group to keep it apart from FSDP's); dispatch and combine wait for it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/nn/moe.h"

namespace fsdp::dist {

// The global experts [first, first + count) that rank ep_rank of an ep group of ep_size holds.
// Refuses a num_experts that ep_size does not divide.
struct LocalExperts {
  int64_t first = 0, count = 0;
};
LocalExperts local_experts(int64_t num_experts, int ep_size, int ep_rank);

class ExpertDispatch final : public nn::ExpertExchange {
 public:
  // Collective over `ep` (every rank, the same num_experts): exchanges the counts. counts[e] is
  // the number of this rank's rows routed to global expert e (>= 0; one per expert).
  ExpertDispatch(std::shared_ptr<ProcessGroup> ep, int64_t num_experts,
                 std::vector<int64_t> counts);

  // rows [sum(counts), ...] -> [num_received(), ...]: the rows of this rank's local experts from
  // every rank of the group, grouped by local expert (local_counts() rows each), source rank
  // order within each. Collective over the group.
  Tensor dispatch(const Tensor& rows) const override;
  // expert_rows [num_received(), ...] in dispatch's order -> [sum(counts), ...] in the order of
  // the rows handed to dispatch. The row shape may differ from dispatch's (an expert's output).
  // Collective over the group.
  Tensor combine(const Tensor& expert_rows) const override;
  // The gradients: a permutation's backward is its inverse.
  Tensor dispatch_backward(const Tensor& d_received) const { return combine(d_received); }
  Tensor combine_backward(const Tensor& d_rows) const { return dispatch(d_rows); }

  LocalExperts experts() const { return experts_; }
  // Rows each local expert receives (sum over sources), in local expert order.
  const std::vector<int64_t>& local_counts() const override { return local_counts_; }
  // received_counts()[s * L + e]: rows that ep rank s sends for local expert e.
  const std::vector<int64_t>& received_counts() const { return recv_counts_; }
  int64_t num_received() const { return num_received_; }
  int64_t num_sent() const { return num_sent_; }

 private:
  // Copies row blocks of `from` into `to`: the blocks are (source, local expert) in one and
  // (local expert, source) in the other; to_grouped says which way.
  void regroup(const Tensor& from, const Tensor& to, bool to_grouped) const;

  std::shared_ptr<ProcessGroup> ep_;
  LocalExperts experts_;
  std::vector<int64_t> counts_, recv_counts_, local_counts_;
  std::vector<int64_t> send_splits_, recv_splits_;  // rows per ep rank
  int64_t num_sent_ = 0, num_received_ = 0;
};

// An MoE's expert parallel over `ep` (nn::MoE::set_expert_parallel): its rank and size, and an
// ExpertDispatch over the group for each forward. Null or one rank: none.
nn::ExpertParallel expert_parallel(std::shared_ptr<ProcessGroup> ep, int64_t num_experts);

}  // namespace fsdp::dist
