// Expert parallel's dispatch and combine with real ranks (run as dist_test is: mpirun and fsdprun
// at np 1..4). Every rank builds every rank's rows and counts from (rank, seed), so it can compute
// locally what a one-rank run over the ep group's rows gives and compare element by element: the
// rows each expert receives, dispatch then combine as the identity, a per-expert linear map
// between them, and each op's backward as the other's adjoint.
#include "fsdp/distributed/expert_parallel.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "dist_main.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/init.h"
#include "fsdp/ops/ops.h"
#include "src/distributed/meta_group.h"
#include "test_util.h"

namespace fsdp::dist {
namespace {

constexpr int64_t kCols = 5, kOut = 3,
                  kLocal = 2;  // row width, expert output width, experts per rank

// World rank r's rows routed to experts: counts in [0, 3] per expert from (r, seed), so zeros
// occur; rank 0 sends no row to expert 0 and no rank sends one to the last expert (a local
// expert that receives nothing).
struct Batch {
  std::vector<int64_t> counts;
  Tensor rows;  // [sum(counts), kCols], expert e's rows contiguous, in expert order
};

Batch batch_of(int rank, int64_t experts, DType dt, bool integers = false) {
  std::mt19937 rng(uint32_t(1000 + rank));
  Batch b;
  int64_t n = 0;
  for (int64_t e = 0; e < experts; ++e) {
    int64_t c = int64_t(rng() % 4);
    if ((rank == 0 && e == 0) || e == experts - 1) c = 0;
    b.counts.push_back(c);
    n += c;
  }
  b.rows = integers ? test::random_tensor({n, kCols}, uint64_t(50 + rank), DType::f64, -8, 8)
                    : test::random_tensor({n, kCols}, uint64_t(50 + rank), dt);
  if (integers) {  // small integers: every sum of products below is exact in f64
    double* p = b.rows.data<double>();
    for (int64_t i = 0; i < b.rows.numel(); ++i) p[i] = double(int64_t(p[i]));
  }
  return b;
}

int64_t offset_of(const std::vector<int64_t>& counts, int64_t expert) {
  int64_t o = 0;
  for (int64_t e = 0; e < expert; ++e) o += counts[size_t(e)];
  return o;
}

// The world ranks of this rank's ep group (make_expert_mesh: consecutive ranks), in ep order.
std::vector<int> ep_members(int64_t ep) {
  std::vector<int> v;
  const int first = int(world()->rank() / ep * ep);
  for (int j = 0; j < ep; ++j) v.push_back(first + j);
  return v;
}

// The ep sizes to run at this world size: EP = world, and EP 2 x FSDP where it divides.
std::vector<int64_t> ep_sizes() {
  const int64_t n = world()->size();
  std::vector<int64_t> v{n};
  if (n > 2 && n % 2 == 0) v.push_back(2);
  return v;
}

// One rank's view of a one-rank run over the ep group: expert g's rows from every member,
// concatenated in ep order.
Tensor rows_of_expert(const std::vector<Batch>& all, int64_t g) {
  int64_t n = 0;
  for (const Batch& b : all) n += b.counts[size_t(g)];
  Tensor x = Tensor::empty({n, all[0].rows.size(1)}, all[0].rows.dtype());
  int64_t at = 0;
  for (const Batch& b : all) {
    const int64_t c = b.counts[size_t(g)];
    if (c)
      x.slice(at, at + c).copy_(b.rows.slice(offset_of(b.counts, g), offset_of(b.counts, g) + c));
    at += c;
  }
  return x;
}

TEST(ExpertParallel, DispatchDeliversWhatOneRankSelectsAndCombineInvertsIt) {
  for (int64_t ep : ep_sizes())
    for (DType dt : {DType::f32, DType::f64}) {
      auto mesh = init_expert_mesh(ep);
      auto group = mesh->group("ep");
      const int64_t experts = ep * kLocal;
      std::vector<Batch> all;
      for (int r : ep_members(ep)) all.push_back(batch_of(r, experts, dt));
      const Batch& mine = all[size_t(group->rank())];
      ExpertDispatch d(group, experts, mine.counts);
      ASSERT_EQ(d.experts().first, group->rank() * kLocal);
      Tensor got = d.dispatch(mine.rows);
      ASSERT_EQ(got.size(0), d.num_received());
      int64_t at = 0;
      for (int64_t e = 0; e < kLocal; ++e) {
        Tensor want = rows_of_expert(all, d.experts().first + e);
        ASSERT_EQ(d.local_counts()[size_t(e)], want.size(0)) << "ep " << ep << " expert " << e;
        EXPECT_EQ(got.slice(at, at + want.size(0)).to_f64_vector(), want.to_f64_vector())
            << "ep " << ep << " " << dtype_name(dt) << " local expert " << e;
        at += want.size(0);
      }
      EXPECT_EQ(d.combine(got).to_f64_vector(), mine.rows.to_f64_vector())
          << "dispatch then combine, ep " << ep << " " << dtype_name(dt);
    }
}

// y = x W_g^T for each row x of global expert g, applied between dispatch and combine, equals
// the same GEMMs at one rank over the ep group's rows (exact: the same matrices), and a row by
// row f64 sum (to rounding).
TEST(ExpertParallel, PerExpertLinearMapMatchesOneRank) {
  for (int64_t ep : ep_sizes()) {
    auto mesh = init_expert_mesh(ep);
    auto group = mesh->group("ep");
    const int64_t experts = ep * kLocal;
    std::vector<Tensor> w;
    for (int64_t g = 0; g < experts; ++g) w.push_back(test::random_tensor({kOut, kCols}, 300 + g));
    std::vector<Batch> all;
    for (int r : ep_members(ep)) all.push_back(batch_of(r, experts, DType::f64));
    const int me = group->rank();
    const Batch& mine = all[size_t(me)];
    ExpertDispatch d(group, experts, mine.counts);
    Tensor x = d.dispatch(mine.rows);
    Tensor y = Tensor::zeros({x.size(0), kOut}, DType::f64);
    int64_t at = 0;
    for (int64_t e = 0; e < kLocal; ++e) {
      const int64_t n = d.local_counts()[size_t(e)];
      if (n)
        y.slice(at, at + n)
            .copy_(ops::matmul(x.slice(at, at + n), w[size_t(d.experts().first + e)], false, true));
      at += n;
    }
    Tensor mine_y = d.combine(y);
    ASSERT_EQ(mine_y.shape(), (Shape{mine.rows.size(0), kOut}));
    // One rank: each expert's GEMM over all its rows, then this rank's part of each.
    Tensor want = Tensor::zeros({mine.rows.size(0), kOut}, DType::f64);
    for (int64_t g = 0; g < experts; ++g) {
      const int64_t c = mine.counts[size_t(g)];
      Tensor xs = rows_of_expert(all, g);
      if (c == 0) continue;
      Tensor ys = ops::matmul(xs, w[size_t(g)], false, true);
      int64_t before = 0;  // rows of expert g from ep ranks before me
      for (int s = 0; s < me; ++s) before += all[size_t(s)].counts[size_t(g)];
      const int64_t o = offset_of(mine.counts, g);
      want.slice(o, o + c).copy_(ys.slice(before, before + c));
      for (int64_t i = 0; i < c; ++i)  // and row by row
        for (int64_t k = 0; k < kOut; ++k) {
          double s = 0;
          for (int64_t j = 0; j < kCols; ++j)
            s += mine.rows.data<double>()[(o + i) * kCols + j] *
                 w[size_t(g)].data<double>()[k * kCols + j];
          EXPECT_NEAR(mine_y.data<double>()[(o + i) * kOut + k], s, 1e-12);
        }
    }
    EXPECT_EQ(mine_y.to_f64_vector(), want.to_f64_vector()) << "ep " << ep;
  }
}

// <dispatch(x), g> = <x, dispatch_backward(g)> and <combine(u), v> = <u, combine_backward(v)>,
// summed over the group: exact with small integers.
TEST(ExpertParallel, EachBackwardIsTheOthersAdjoint) {
  for (int64_t ep : ep_sizes()) {
    auto group = init_expert_mesh(ep)->group("ep");
    const int64_t experts = ep * kLocal;
    const Batch mine = batch_of(ep_members(ep)[size_t(group->rank())], experts, DType::f64, true);
    ExpertDispatch d(group, experts, mine.counts);
    Tensor g = test::random_tensor({d.num_received(), kCols}, 7 + uint64_t(group->rank()),
                                   DType::f64, -8, 8);
    for (int64_t i = 0; i < g.numel(); ++i)
      g.data<double>()[i] = double(int64_t(g.data<double>()[i]));
    Tensor sums = Tensor::from_vector<double>(
        {test::dot(d.dispatch(mine.rows), g), test::dot(mine.rows, d.dispatch_backward(g)),
         test::dot(d.combine(g), mine.rows), test::dot(g, d.combine_backward(mine.rows))},
        {4});
    group->all_reduce(sums, ReduceOp::SUM)->wait();
    const auto s = sums.to_f64_vector();
    EXPECT_EQ(s[0], s[1]) << "dispatch's backward, ep " << ep;
    EXPECT_EQ(s[2], s[3]) << "combine's backward, ep " << ep;
  }
}

// The memory plan's run: over a meta group (every rank taken to route as this one does) the
// exchange moves nothing and gives rows of the planned shapes on the meta device.
TEST(ExpertParallel, RunsOnTheMetaDevice) {
  auto g = std::make_shared<MetaGroup>(4, 1);
  ExpertDispatch d(g, 8, {1, 0, 2, 3, 0, 0, 4, 1});
  EXPECT_EQ(d.experts().first, 2);
  // The meta group's equal-block all-to-all hands back this rank's own counts: sender s's rows
  // for local expert e are counts[2 s + e].
  EXPECT_EQ(d.local_counts(), (std::vector<int64_t>{7, 4}));
  Tensor x = d.dispatch(Tensor::empty({11, kCols}, DType::bf16, Device::meta()));
  EXPECT_TRUE(x.device().is_meta());
  EXPECT_EQ(x.shape(), (Shape{11, kCols}));
  EXPECT_EQ(d.combine(Tensor::empty({11, kOut}, DType::bf16, Device::meta())).shape(),
            (Shape{11, kOut}));
}

TEST(ExpertParallel, BadCountsAreRefused) {
  const int n = world()->size();
  auto says = [](const std::function<void()>& f, const std::string& what) {
    const std::string err = test::error_of(f);
    EXPECT_NE(err.find(what), std::string::npos)
        << "expected an error saying '" << what << "', got '" << err << "'";
  };
  says([&] { ExpertDispatch(world(), 2 * n, std::vector<int64_t>(size_t(2 * n + 1), 0)); },
       "row counts for");
  if (n > 1)
    says([&] { ExpertDispatch(world(), 2 * n + 1, std::vector<int64_t>(size_t(2 * n + 1), 0)); },
         "do not split evenly");
  std::vector<int64_t> negative(size_t(2 * n), 0);
  negative[0] = -1;
  says([&] { ExpertDispatch(world(), 2 * n, negative); }, "expected >= 0");
  std::vector<int64_t> one(size_t(2 * n), 0);
  one[0] = 1;
  ExpertDispatch d(world(), 2 * n, one);
  says([&] { d.dispatch(Tensor::zeros({2, kCols}, DType::f32)); }, "expected 1 rows");
  world()->barrier()->wait();
}

}  // namespace
}  // namespace fsdp::dist

int main(int argc, char** argv) {
  return fsdp::test::dist_test_main(argc, argv, "expert_parallel_test");
}
