// nn::MoE under expert parallel with real ranks (run as expert_parallel_test is: mpirun and fsdprun
// at np 1..4). Each rank holds its ep group's share of the experts and routes its own tokens; its
// outputs, its inputs' gradients, its experts' gradients and the router's gradient summed over the
// group equal those of one MoE holding every expert over the group's tokens concatenated in rank
// order, which every rank computes locally.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dist_main.h"
#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/expert_parallel.h"
#include "fsdp/distributed/init.h"
#include "fsdp/nn/moe.h"
#include "fsdp/nn/module.h"
#include "src/distributed/meta_group.h"
#include "test_util.h"

namespace fsdp::nn {
namespace {

constexpr int64_t kDim = 6, kExperts = 4, kTopK = 2, kHidden = 5;

int64_t rows_of(int rank) { return 3 + rank % 3; }  // uneven across ranks
Tensor tokens(int rank, uint64_t salt) {
  return test::random_tensor({rows_of(rank), kDim}, salt * 100 + uint64_t(rank), DType::f64);
}

// The tokens of ranks [first, first + n) concatenated.
Tensor group_tokens(int first, int n, uint64_t salt) {
  int64_t rows = 0;
  for (int r = first; r < first + n; ++r) rows += rows_of(r);
  Tensor x = Tensor::empty({rows, kDim}, DType::f64);
  int64_t at = 0;
  for (int r = first; r < first + n; ++r) {
    x.narrow(0, at, rows_of(r)).copy_(tokens(r, salt));
    at += rows_of(r);
  }
  return x;
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::vector<double> g = got.to_f64_vector(), w = want.to_f64_vector();
  ASSERT_EQ(g.size(), w.size()) << what;
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], 1e-12 * std::max(1.0, std::fabs(w[i]))) << what << " [" << i << "]";
}

// The ep sizes that split kExperts at this world size: EP = world, and EP 2 x FSDP where it divides.
std::vector<int64_t> ep_sizes() {
  const int64_t n = dist::world()->size();
  std::vector<int64_t> v;
  if (kExperts % n == 0) v.push_back(n);
  if (n > 2 && n % 2 == 0) v.push_back(2);
  return v;
}

TEST(MoEExpertParallel, EqualsOneRankOverTheGroupsTokens) {
  const int rank = dist::world()->rank();
  if (ep_sizes().empty()) GTEST_SKIP() << "no ep size splits " << kExperts << " experts here";
  for (RouterKind router : {RouterKind::softmax_topk, RouterKind::topk_softmax})
    for (int64_t ep : ep_sizes()) {
      SCOPED_TRACE("ep " + std::to_string(ep) + ", router " + router_kind_name(router));
      auto group = dist::make_expert_mesh(dist::world(), ep)->group("ep");
      const MoEOptions opt{.experts = kExperts, .top_k = kTopK, .hidden = kHidden,
                           .router = router,
                           .norm_topk_prob = router == RouterKind::softmax_topk};
      MoE whole(kDim, opt), part(kDim, opt);
      part.set_expert_parallel(dist::expert_parallel(group, kExperts));
      materialize(whole, DType::f64, 3);
      materialize(part, DType::f64, 4);
      const int64_t first = part.first_local_expert(), local = part.local_experts();
      ASSERT_EQ(local, kExperts / ep);
      ASSERT_EQ(first, (rank % ep) * local);
      for (auto& [name, p] : part.named_parameters()) {
        const Tensor w = whole.parameter(name).data;
        p->data.copy_(name.starts_with("experts.") ? w.narrow(0, first, local) : w);
      }
      // The group's ranks are consecutive (make_expert_mesh); this rank's rows within them.
      const int lead = int(rank / ep * ep);
      int64_t off = 0;
      for (int r = lead; r < rank; ++r) off += rows_of(r);
      const Tensor y = part.forward(tokens(rank, 1));
      const Tensor yw = whole.forward(group_tokens(lead, int(ep), 1));
      expect_close(y, yw.narrow(0, off, rows_of(rank)), "output");
      const Tensor dx = part.backward(tokens(rank, 2));
      const Tensor dxw = whole.backward(group_tokens(lead, int(ep), 2));
      expect_close(dx, dxw.narrow(0, off, rows_of(rank)), "input gradient");
      for (auto& [name, p] : part.named_parameters()) {
        const Tensor w = whole.parameter(name).grad;
        if (name.starts_with("experts.")) {
          expect_close(p->grad, w.narrow(0, first, local), name);
        } else {  // the router's: each rank's tokens' share
          Tensor sum = p->grad.clone();
          group->all_reduce(sum, dist::ReduceOp::SUM)->wait();
          expect_close(sum, w, name);
        }
      }
    }
}

// The memory plan's run: over a meta group an MoE with its share of the experts allocates the
// planned shapes and computes nothing.
TEST(MoEExpertParallel, RunsOnTheMetaDevice) {
  MoE m(kDim, {.experts = kExperts, .top_k = kTopK, .hidden = kHidden});
  m.set_expert_parallel(dist::expert_parallel(std::make_shared<dist::MetaGroup>(2, 1), kExperts));
  materialize(m, DType::bf16, 3, Device::meta());
  EXPECT_EQ(m.first_local_expert(), kExperts / 2);
  EXPECT_EQ(m.parameter("experts.gate_proj").data.shape(), (Shape{kExperts / 2, kHidden, kDim}));
  EXPECT_EQ(m.parameter("experts.down_proj").data.shape(), (Shape{kExperts / 2, kDim, kHidden}));
  const Tensor y = m.forward(Tensor::empty({2, 3, kDim}, DType::bf16, Device::meta()));
  EXPECT_TRUE(y.device().is_meta());
  EXPECT_EQ(y.shape(), (Shape{2, 3, kDim}));
  EXPECT_EQ(m.backward(Tensor::empty({2, 3, kDim}, DType::bf16, Device::meta())).shape(),
            (Shape{2, 3, kDim}));
}

TEST(MoEExpertParallel, RefusesExpertsTheGroupDoesNotSplit) {
  if (dist::world()->size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  MoE m(kDim, {.experts = 3, .top_k = 1, .hidden = kHidden});
  auto group = dist::make_expert_mesh(dist::world(), 2)->group("ep");
  EXPECT_THROW(
      {
        try {
          m.set_expert_parallel(dist::expert_parallel(group, 3));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("3 experts do not split evenly over an "
                                               "expert-parallel group of 2 ranks"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  MoE ok(kDim, {.experts = 4, .top_k = 1, .hidden = kHidden});
  ok.set_expert_parallel(dist::expert_parallel(group, 4));
  materialize(ok, DType::f32, 3);
  EXPECT_THROW(ok.set_expert_parallel(dist::expert_parallel(group, 4)), Error);  // after the parameters materialized
}

}  // namespace
}  // namespace fsdp::nn

int main(int argc, char** argv) { return fsdp::test::dist_test_main(argc, argv, "moe_ep_test"); }
