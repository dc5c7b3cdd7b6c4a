// Expert parallel's dispatch and combine (fsdp/distributed/expert_parallel.h): a small all-to-all
// of counts, an all_to_all_v of rows, and a regrouping of row blocks by copies (so it runs as it
// is on CPU, CUDA and the meta device).
#include "fsdp/distributed/expert_parallel.h"

#include <cstddef>
#include <functional>
#include <type_traits>
#include <utility>

#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"

namespace fsdp::dist {

LocalExperts local_experts(int64_t num_experts, int ep_size, int ep_rank) {
  FSDP_CHECK(ep_size >= 1 && ep_rank >= 0 && ep_rank < ep_size,
             "[expert parallel] rank {} of an ep group of {}", ep_rank, ep_size);
  FSDP_CHECK(num_experts >= 1 && num_experts % ep_size == 0,
             "[expert parallel] {} experts do not split evenly over the {} ranks of the ep group",
             num_experts, ep_size);
  const int64_t l = num_experts / ep_size;
  return {int64_t(ep_rank) * l, l};
}

ExpertDispatch::ExpertDispatch(std::shared_ptr<ProcessGroup> ep, int64_t num_experts,
                               std::vector<int64_t> counts)
    : ep_(std::move(ep)), counts_(std::move(counts)) {
  FSDP_CHECK(ep_, "[expert parallel] no ep group");
  const int n = ep_->size();
  experts_ = local_experts(num_experts, n, ep_->rank());
  FSDP_CHECK(int64_t(counts_.size()) == num_experts,
             "[expert parallel] {} row counts for {} experts; expected one per expert",
             counts_.size(), num_experts);
  const int64_t l = experts_.count;
  Tensor send = Tensor::empty({num_experts}, DType::i64);
  for (int64_t e = 0; e < num_experts; ++e) {
    FSDP_CHECK(counts_[size_t(e)] >= 0, "[expert parallel] counts[{}] is {}; expected >= 0", e,
               counts_[size_t(e)]);
    send.data<int64_t>()[e] = counts_[size_t(e)];
  }
  // Rank j's block of the counts is what this rank sends j's experts: equal blocks of l.
  Tensor recv = Tensor::empty({num_experts}, DType::i64);
  ep_->all_to_all_single(recv, send)->wait();
  recv_counts_.assign(recv.data<int64_t>(), recv.data<int64_t>() + num_experts);
  send_splits_.assign(size_t(n), 0);
  recv_splits_.assign(size_t(n), 0);
  local_counts_.assign(size_t(l), 0);
  for (int s = 0; s < n; ++s)
    for (int64_t e = 0; e < l; ++e) {
      const size_t i = size_t(s * l + e);
      send_splits_[size_t(s)] += counts_[i];
      recv_splits_[size_t(s)] += recv_counts_[i];
      local_counts_[size_t(e)] += recv_counts_[i];
    }
  for (int s = 0; s < n; ++s) {
    num_sent_ += send_splits_[size_t(s)];
    num_received_ += recv_splits_[size_t(s)];
  }
}

void ExpertDispatch::regroup(const Tensor& from, const Tensor& to, bool to_grouped) const {
  const int n = ep_->size();
  const int64_t l = experts_.count;
  // Offsets of block (s, e) in the (source, local expert) order and the (expert, source) order.
  std::vector<int64_t> by_source(size_t(n * l)), by_expert(size_t(n * l));
  int64_t at = 0;
  for (int s = 0; s < n; ++s)
    for (int64_t e = 0; e < l; ++e) {
      by_source[size_t(s * l + e)] = at;
      at += recv_counts_[size_t(s * l + e)];
    }
  at = 0;
  for (int64_t e = 0; e < l; ++e)
    for (int s = 0; s < n; ++s) {
      by_expert[size_t(s * l + e)] = at;
      at += recv_counts_[size_t(s * l + e)];
    }
  for (size_t i = 0; i < by_source.size(); ++i) {
    const int64_t rows = recv_counts_[i];
    if (rows == 0) continue;
    const int64_t src = to_grouped ? by_source[i] : by_expert[i];
    const int64_t dst = to_grouped ? by_expert[i] : by_source[i];
    to.narrow(0, dst, rows).copy_(from.narrow(0, src, rows));
  }
}

namespace {

Shape with_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}

}  // namespace

Tensor ExpertDispatch::dispatch(const Tensor& rows) const {
  FSDP_CHECK(rows.defined() && rows.dim() >= 1 && rows.size(0) == num_sent_,
             "[expert parallel] dispatch of rows {}; expected {} rows (the sum of the counts)",
             rows.defined() ? shape_str(rows.shape()) : "undefined", num_sent_);
  Tensor raw = Tensor::empty(with_rows(rows, num_received_), rows.dtype(), rows.device());
  ep_->all_to_all_v(raw, recv_splits_, rows, send_splits_)->wait();
  if (experts_.count == 1) return raw;  // already (local expert, source)
  Tensor grouped = Tensor::empty(raw.shape(), raw.dtype(), raw.device());
  regroup(raw, grouped, true);
  return grouped;
}

Tensor ExpertDispatch::combine(const Tensor& expert_rows) const {
  FSDP_CHECK(
      expert_rows.defined() && expert_rows.dim() >= 1 && expert_rows.size(0) == num_received_,
      "[expert parallel] combine of rows {}; expected the {} rows dispatch delivered",
      expert_rows.defined() ? shape_str(expert_rows.shape()) : "undefined", num_received_);
  Tensor raw = expert_rows;
  if (experts_.count > 1) {
    raw = Tensor::empty(expert_rows.shape(), expert_rows.dtype(), expert_rows.device());
    regroup(expert_rows, raw, false);
  }
  Tensor out = Tensor::empty(with_rows(expert_rows, num_sent_), raw.dtype(), raw.device());
  ep_->all_to_all_v(out, send_splits_, raw, recv_splits_)->wait();
  return out;
}

nn::ExpertParallel expert_parallel(std::shared_ptr<ProcessGroup> ep, int64_t num_experts) {
  if (!ep || ep->size() == 1) return {};
  nn::ExpertParallel p{.size = ep->size(), .rank = ep->rank()};
  p.exchange = [ep = std::move(ep), num_experts](std::vector<int64_t> counts) {
    return std::make_shared<const ExpertDispatch>(ep, num_experts, std::move(counts));
  };
  return p;
}

}  // namespace fsdp::dist
