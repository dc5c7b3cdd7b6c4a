// nn::MoE's router loss: the statistics each call records, summed over the layers (and the ranks),
// and the load-balancing and z-loss terms with their gradients (fsdp/nn/moe.h holds the formulas).
#include <cstddef>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/nn/moe.h"

namespace fsdp::nn {

void RouterTotals::add(const RouterCall& call) {
  if (pairs.empty()) {
    pairs.assign(call.pairs.size(), 0.0);
    prob_sum.assign(call.pairs.size(), 0.0);
  }
  FSDP_CHECK(call.pairs.size() == pairs.size(),
             "[MoE] router statistics of {} experts added to totals of {}", call.pairs.size(),
             pairs.size());
  for (size_t e = 0; e < pairs.size(); ++e) {
    pairs[e] += call.pairs[e];
    prob_sum[e] += call.prob_sum[e];
  }
  rows += double(call.rows);
  z_sum += call.z_sum;
}

std::vector<double> RouterTotals::as_vector() const {
  std::vector<double> v = pairs;
  v.insert(v.end(), prob_sum.begin(), prob_sum.end());
  v.push_back(rows);
  v.push_back(z_sum);
  return v;
}

RouterTotals RouterTotals::from_vector(const std::vector<double>& v) {
  FSDP_CHECK(v.size() >= 4 && v.size() % 2 == 0,
             "[MoE] router totals need 2E + 2 numbers (C, P, T, z), got {}", v.size());
  const size_t e = (v.size() - 2) / 2;
  RouterTotals t;
  t.pairs.assign(v.begin(), v.begin() + ptrdiff_t(e));
  t.prob_sum.assign(v.begin() + ptrdiff_t(e), v.begin() + ptrdiff_t(2 * e));
  t.rows = v[2 * e];
  t.z_sum = v[2 * e + 1];
  return t;
}

RouterLoss router_aux_loss(const RouterTotals& totals, const RouterLossOptions& opt) {
  const auto E = size_t(opt.experts);
  FSDP_CHECK(opt.experts > 0 && totals.pairs.size() == E && totals.prob_sum.size() == E,
             "[MoE] router loss over {} experts, but the totals hold {}", opt.experts,
             totals.pairs.size());
  RouterLoss out;
  out.grad.dprob.assign(E, 0.0);
  if (totals.rows <= 0) return out;
  const double T = totals.rows;
  if (opt.aux_coef != 0) {
    // transformers: E * sum_{j,e} mean_t(onehot[t, j, e]) * mean_t(p[t, e])
    double aux = 0;
    for (size_t e = 0; e < E; ++e) {
      aux += totals.pairs[e] * totals.prob_sum[e];
      out.grad.dprob[e] = opt.aux_coef * double(E) * totals.pairs[e] / (T * T) * opt.grad_scale;
    }
    out.value += opt.aux_coef * double(E) * aux / (T * T);
  }
  if (opt.z_coef != 0) {
    out.value += opt.z_coef * totals.z_sum / T;
    out.grad.dz = opt.z_coef / T * opt.grad_scale;
  }
  return out;
}

}  // namespace fsdp::nn
