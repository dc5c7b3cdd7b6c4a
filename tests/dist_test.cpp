// The distributed runtime with real ranks: run under
//   mpirun --oversubscribe -np N dist_test          (MPI)
//   scripts/fsdprun --nproc_per_node N dist_test    (Gloo over TCP)
// Every collective x every dtype x uneven sizes is checked element by element
// against values computed locally; DTensor placements round-trip on a 1-D
// mesh and (at 4 ranks) a 2x2 mesh; overlap is checked through ordering.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "dist_main.h"
#include "fsdp/core/meta.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/dtensor.h"
#include "fsdp/distributed/init.h"
#include "fsdp/ops/ops.h"
#include "src/distributed/meta_group.h"
#include "test_util.h"

namespace fsdp::dist {
namespace {

const DType kAllDtypes[] = {DType::f32, DType::f64, DType::bf16,
                            DType::f16, DType::i32, DType::i64};
const int64_t kSizes[] = {0, 1, 7, 1000};

// Small integers: exact in every dtype, and so are their sums over 4 ranks.
double value(int rank, int64_t i) { return double(rank * 8 + i % 8); }

Tensor filled(int64_t n, DType dt, int rank, int64_t offset = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(rank, offset + i);
  return Tensor::from_vector(v, {n}).to(dt);
}

std::shared_ptr<ProcessGroup> W() { return world(); }

TEST(Collectives, AllGather) {
  const int R = W()->size(), me = W()->rank();
  for (DType dt : kAllDtypes)
    for (int64_t n : kSizes) {
      Tensor out = Tensor::full({n * R}, -1, dt);
      W()->all_gather_into_tensor(out, filled(n, dt, me))->wait();
      auto got = out.to_f64_vector();
      for (int r = 0; r < R; ++r)
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(got[size_t(r * n + i)], value(r, i))
              << dtype_name(dt) << " n " << n << " from rank " << r;
    }
}

TEST(Collectives, ReduceScatterSumAndAvg) {
  const int R = W()->size(), me = W()->rank();
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG})
    for (DType dt : kAllDtypes) {
      if (op == ReduceOp::AVG && !is_floating(dt)) continue;
      for (int64_t n : kSizes) {
        Tensor out = Tensor::full({n}, -1, dt);
        W()->reduce_scatter_tensor(out, filled(n * R, dt, me), op)->wait();
        auto got = out.to_f64_vector();
        for (int64_t i = 0; i < n; ++i) {
          double s = 0;
          for (int r = 0; r < R; ++r) s += value(r, me * n + i);
          if (op == ReduceOp::AVG) s /= R;
          ASSERT_NEAR(got[size_t(i)], s, dt == DType::bf16 ? 0.26 : 1e-12)
              << dtype_name(dt) << " n " << n;
        }
      }
    }
}

TEST(Collectives, AllReduceSumAndAvg) {
  const int R = W()->size(), me = W()->rank();
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG})
    for (DType dt : kAllDtypes) {
      if (op == ReduceOp::AVG && !is_floating(dt)) continue;
      for (int64_t n : kSizes) {
        Tensor t = filled(n, dt, me);
        W()->all_reduce(t, op)->wait();
        auto got = t.to_f64_vector();
        for (int64_t i = 0; i < n; ++i) {
          double s = 0;
          for (int r = 0; r < R; ++r) s += value(r, i);
          if (op == ReduceOp::AVG) s /= R;
          ASSERT_NEAR(got[size_t(i)], s, dt == DType::bf16 ? 0.26 : 1e-12)
              << dtype_name(dt) << " n " << n;
        }
      }
    }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  const int R = W()->size(), me = W()->rank();
  for (DType dt : kAllDtypes)
    for (int root = 0; root < R; ++root) {
      Tensor t = filled(7, dt, me);
      W()->broadcast(t, root)->wait();
      auto got = t.to_f64_vector();
      for (int64_t i = 0; i < 7; ++i)
        ASSERT_EQ(got[size_t(i)], value(root, i)) << dtype_name(dt) << " root " << root;
    }
}

TEST(Collectives, AllToAll) {
  const int R = W()->size(), me = W()->rank();
  for (DType dt : kAllDtypes) {
    const int64_t n = 3;
    Tensor out = Tensor::full({n * R}, -1, dt);
    W()->all_to_all_single(out, filled(n * R, dt, me))->wait();
    auto got = out.to_f64_vector();
    for (int r = 0; r < R; ++r)
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[size_t(r * n + i)], value(r, me * n + i)) << dtype_name(dt);
  }
  W()->barrier()->wait();
}

// Rows rank r sends rank j in all_to_all_v: uneven, with zeros inside the pattern, rank 0 sends
// nothing and the last rank receives nothing (at one rank: one empty block).
int64_t rows_sent(int r, int j, int R) {
  if (r == 0 || j == R - 1) return 0;
  return (r * 7 + j * 3) % 4;
}

TEST(Collectives, AllToAllVUnevenAndEmptySplits) {
  const int R = W()->size(), me = W()->rank();
  const int64_t cols = 3;
  std::vector<int64_t> in_splits, out_splits;
  int64_t rows_in = 0, rows_out = 0;
  for (int j = 0; j < R; ++j) {
    in_splits.push_back(rows_sent(me, j, R));
    out_splits.push_back(rows_sent(j, me, R));
    rows_in += in_splits.back();
    rows_out += out_splits.back();
  }
  for (DType dt : kAllDtypes) {
    // Row i of rank r's input holds value(r, i * cols + c): the receiver knows what to expect.
    Tensor in = filled(rows_in * cols, dt, me).reshape({rows_in, cols});
    Tensor out = Tensor::full({rows_out, cols}, -1, dt);
    W()->all_to_all_v(out, out_splits, in, in_splits)->wait();
    auto got = out.to_f64_vector();
    int64_t at = 0;
    for (int src = 0; src < R; ++src) {
      int64_t first = 0;  // the first row src sends me: after what it sends ranks before me
      for (int j = 0; j < me; ++j) first += rows_sent(src, j, R);
      for (int64_t i = 0; i < out_splits[size_t(src)]; ++i, ++at)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(got[size_t(at * cols + c)], value(src, (first + i) * cols + c))
              << dtype_name(dt) << " row " << i << " from rank " << src;
    }
  }
  // One rank sends everything to rank 0 and the others nothing, in f64, large rows.
  std::vector<int64_t> to0(size_t(R), 0), from(size_t(R), 0);
  to0[0] = 5;
  if (me == 0) from.assign(size_t(R), 5);
  Tensor in = filled(5 * 1000, DType::f64, me).reshape({5, 1000});
  Tensor out = Tensor::full({me == 0 ? 5 * R : 0, 1000}, -1, DType::f64);
  W()->all_to_all_v(out, from, in, to0)->wait();
  if (me == 0)
    for (int r = 0; r < R; ++r)
      ASSERT_EQ(out.slice(5 * r, 5 * r + 5).to_f64_vector(),
                filled(5000, DType::f64, r).to_f64_vector());
  W()->barrier()->wait();
}

TEST(Collectives, AllToAllVRefusesBadSplits) {
  const int R = W()->size();
  Tensor in = Tensor::zeros({4, 2}, DType::f32), out = Tensor::zeros({4, 2}, DType::f32);
  std::vector<int64_t> all_to_0(size_t(R), 0);
  all_to_0[0] = 4;
  auto refused = [&](const std::vector<int64_t>& os, const std::vector<int64_t>& is,
                     const Tensor& o, const char* says) {
    const std::string err = test::error_of([&] { W()->all_to_all_v(o, os, in, is); });
    EXPECT_NE(err.find(says), std::string::npos)
        << "expected '" << says << "', got '" << err << "'";
  };
  refused(all_to_0, std::vector<int64_t>(size_t(R + 1), 0), out, "in_splits has");
  std::vector<int64_t> negative(all_to_0);
  negative[0] = 5;
  negative.back() -= 1;
  if (R > 1) refused(all_to_0, negative, out, ">= 0");
  refused(all_to_0, std::vector<int64_t>(size_t(R), 0), out, "sum to 0 rows");
  refused(all_to_0, all_to_0, Tensor::zeros({4, 3}, DType::f32), "differ in shape");
  refused(all_to_0, all_to_0, Tensor::zeros({4, 2}, DType::f64), "output is f64");
}

// Each rank's splits are right on their own, but rank 1 expects a row that rank 0 never sends:
// every rank refuses, naming the pair, before anything moves.
TEST(Collectives, AllToAllVSplitsThatDisagreeAcrossRanksAreNamed) {
  if (W()->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int R = W()->size(), me = W()->rank();
  std::vector<int64_t> in_splits(size_t(R), 0), out_splits(size_t(R), 0);
  if (me == 1) out_splits[0] = 1;
  Tensor out = Tensor::zeros({me == 1 ? 1 : 0, 2}, DType::f32);
  try {
    W()->all_to_all_v(out, out_splits, Tensor::zeros({0, 2}, DType::f32), in_splits)->wait();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 sends 0 rows to rank 1"), std::string::npos)
        << e.what();
  }
  W()->barrier()->wait();
}

TEST(Collectives, LocalMistakesAreRefusedBeforeTheCollective) {
  const int R = W()->size();
  try {
    W()->all_gather_into_tensor(Tensor::empty({5 * R + 1}, DType::f32),
                                Tensor::empty({5}, DType::f32));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output has"), std::string::npos) << e.what();
  }
  EXPECT_THROW(W()->reduce_scatter_tensor(Tensor::empty({2}, DType::i32),
                                          Tensor::empty({2 * R}, DType::i32), ReduceOp::AVG),
               Error);
  EXPECT_THROW(W()->broadcast(Tensor::empty({2}, DType::f32), R), Error);
}

TEST(Collectives, SizesThatDifferAcrossRanksAreNamed) {
  if (W()->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Tensor t = Tensor::zeros({W()->rank() == 1 ? 6 : 5}, DType::f32);
  try {
    W()->all_reduce(t, ReduceOp::SUM)->wait();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranks disagree"), std::string::npos) << e.what();
  }
}

// Rank 0 issues an all-reduce on group A and goes on computing. The other
// ranks join that all-reduce only after rank 0 has finished computing and
// said so over group B. If issuing blocked rank 0, it could never say so.
TEST(Overlap, CollectiveInFlightDoesNotBlockTheCaller) {
  if (W()->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto B = W()->split(0, W()->rank());
  ASSERT_TRUE(B);
  Tensor t = Tensor::full({4096}, 1.0, DType::f32);
  Tensor flag = Tensor::zeros({1}, DType::i32);
  if (W()->rank() == 0) {
    auto work = W()->all_reduce(t, ReduceOp::SUM);
    Tensor a = test::random_tensor({128, 128}, 1, DType::f32);
    Tensor c = ops::matmul(a, a);        // compute while the collective is in flight
    EXPECT_FALSE(work->is_completed());  // nobody else has joined yet
    EXPECT_NE(W()->comm_thread_id(), std::this_thread::get_id());
    flag.fill_(1);
    B->broadcast(flag, 0)->wait();
    work->wait();
    EXPECT_GT(ops::sum_squares(c), 0.0);
  } else {
    B->broadcast(flag, 0)->wait();
    EXPECT_EQ(flag.item(), 1.0);
    W()->all_reduce(t, ReduceOp::SUM)->wait();
  }
  EXPECT_EQ(t.to_f64_vector()[0], double(W()->size()));
}

// ---------------------------------------------------------------- DTensor

Tensor iota(const Shape& s) {
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(i) + 1;
  return Tensor::from_vector(v, s).to(DType::f32);
}

std::vector<Placement> one_d_placements() {
  return {Shard{0}, Shard{1}, Replicate{}, Partial{ReduceOp::SUM}};
}

// The memory plan's group (src/distributed/meta_group.h): this process as rank 0 of a larger world.
// Collectives complete at once; on host tensors every rank holds what this one holds; a 2-D mesh
// over it gets its dims' sizes.
TEST(MetaGroup, StandsForRankZeroOfTheWorld) {
  auto g = std::make_shared<dist::MetaGroup>(4, 0, std::vector<int64_t>{2, 2});
  EXPECT_EQ(g->size(), 4);
  EXPECT_TRUE(g->device().is_meta());
  Tensor out = Tensor::empty({8}, DType::f32);
  g->all_gather_into_tensor(out, Tensor::from_vector<float>({1, 2}, {2}))->wait();
  EXPECT_EQ(out.to_f64_vector(), (std::vector<double>{1, 2, 1, 2, 1, 2, 1, 2}));
  Tensor sum = Tensor::full({1}, 3.0, DType::f64);
  EXPECT_TRUE(g->all_reduce(sum, dist::ReduceOp::SUM)->is_completed());
  EXPECT_EQ(sum.item(), 12.0);
  Tensor avg = Tensor::full({1}, 3.0, DType::f64);
  g->all_reduce(avg, dist::ReduceOp::AVG)->wait();
  EXPECT_EQ(avg.item(), 3.0);
  dist::DeviceMesh mesh(g, {2, 2}, {"replicate", "shard"});
  EXPECT_EQ(mesh.group(0)->size(), 2);
  EXPECT_EQ(mesh.group(1)->size(), 2);
  EXPECT_EQ(mesh.stream_group(1, 0)->size(), 2);
  EXPECT_THROW(dist::MetaGroup(4, 0, {3}), Error);
}

// The memory plan's all_to_all_v: checks the splits, moves nothing on meta tensors, holds both
// buffers until waited for (as the CPU engines' tasks do), and on host tensors copies as a world of
// ranks that all hold this one's data would.
TEST(MetaGroup, AllToAllVHoldsItsBuffersUntilWaited) {
  meta::reset({});
  dist::MetaGroup g(4, 1);
  std::shared_ptr<Work> w;
  {
    Tensor in = Tensor::empty({6, 8}, DType::f32, Device::meta());
    Tensor out = Tensor::empty({10, 8}, DType::f32, Device::meta());
    EXPECT_THROW(g.all_to_all_v(out, {1, 2, 3}, in, {0, 6, 0, 0}), Error);
    EXPECT_THROW(g.all_to_all_v(out, {1, 2, 3, 3}, in, {0, 6, 0, 0}), Error);
    w = g.all_to_all_v(out, {1, 2, 3, 4}, in, {0, 6, 0, 0});
  }
  EXPECT_TRUE(w->is_completed());
  EXPECT_GE(meta::stats().live, int64_t((6 + 10) * 8 * sizeof(float)));
  w->wait();
  EXPECT_EQ(meta::stats().live, 0);
  Tensor host_out = Tensor::zeros({3}, DType::f64);
  g.all_to_all_v(host_out, {0, 1, 2, 0}, Tensor::from_vector<double>({1, 2, 3}, {3}), {0, 1, 2, 0})
      ->wait();
  EXPECT_EQ(host_out.to_f64_vector(), (std::vector<double>{1, 2, 3}));
  EXPECT_THROW(g.all_to_all_v(host_out, {0, 1, 2, 0}, host_out, {1, 0, 2, 0}), Error);
}

TEST(Chunk, MatchesTorchChunk) {
  // torch.chunk(range(5), 4) -> [0,1] [2,3] [4] []
  using Range = std::pair<int64_t, int64_t>;
  EXPECT_EQ(chunk_range(5, 4, 0), Range(0, 2));
  EXPECT_EQ(chunk_range(5, 4, 2), Range(4, 1));
  EXPECT_EQ(chunk_range(5, 4, 3), Range(5, 0));
  EXPECT_EQ(chunk_range(3, 4, 3).second, 0);
}

TEST(DTensor, OneDimMeshRoundTrips) {
  auto mesh = init_device_mesh({W()->size()}, {"shard"});
  for (Shape shape : {Shape{7, 5}, Shape{2, 9}, Shape{3, 1}}) {
    Tensor full = iota(shape);
    for (const Placement& p : one_d_placements()) {
      DTensor d = DTensor::distribute_tensor(full, mesh, {p});
      EXPECT_EQ(d.to_local().shape(), DTensor::local_shape(shape, *mesh, {p}, mesh->coordinate()));
      if (auto* s = std::get_if<Shard>(&p)) {  // the local piece is this rank's torch.chunk
        auto [b, len] = chunk_range(shape[size_t(s->dim)], W()->size(), W()->rank());
        EXPECT_EQ(d.to_local().to_f64_vector(), full.narrow(s->dim, b, len).to_f64_vector());
      }
      EXPECT_EQ(d.full_tensor().to_f64_vector(), full.to_f64_vector()) << placement_str(p);
      for (const Placement& q : one_d_placements()) {
        DTensor e = d.redistribute({q});
        EXPECT_EQ(e.full_tensor().to_f64_vector(), full.to_f64_vector())
            << shape_str(shape) << " " << placement_str(p) << " -> " << placement_str(q);
      }
    }
  }
}

TEST(DTensor, FromLocalWithUnevenGlobalShape) {
  auto mesh = init_device_mesh({W()->size()});
  Tensor full = iota({10, 3});
  auto [b, len] = chunk_range(10, W()->size(), W()->rank());
  DTensor d =
      DTensor::from_local(full.slice(b, b + len).contiguous(), mesh, {Shard{0}}, Shape{10, 3});
  EXPECT_EQ(d.full_tensor().to_f64_vector(), full.to_f64_vector());
  EXPECT_EQ(d.stride(), Shape({3, 1}));
  EXPECT_THROW(
      DTensor::from_local(Tensor::empty({len + 1, 3}, DType::f32), mesh, {Shard{0}}, Shape{10, 3}),
      Error);
}

TEST(DTensor, TwoByTwoMeshRoundTrips) {
  if (W()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto mesh = init_device_mesh({2, 2}, {"replicate", "shard"});
  EXPECT_EQ(mesh->group(0)->size(), 2);
  EXPECT_EQ(mesh->group("shard")->size(), 2);
  EXPECT_EQ((*mesh)["shard"]->size(), 2);
  EXPECT_EQ(mesh->group(1)->rank(), W()->rank() % 2);
  const Shape shape{9, 5};
  Tensor full = iota(shape);
  const std::vector<Placement> ps = {Shard{0}, Shard{1}, Replicate{}, Partial{ReduceOp::SUM}};
  for (const Placement& a : ps)
    for (const Placement& b : ps) {
      DTensor d = DTensor::distribute_tensor(full, mesh, {a, b});
      ASSERT_EQ(d.to_local().shape(),
                DTensor::local_shape(shape, *mesh, {a, b}, mesh->coordinate()));
      ASSERT_EQ(d.full_tensor().to_f64_vector(), full.to_f64_vector())
          << placement_str(a) << placement_str(b);
      for (const Placement& c : ps)
        for (const Placement& e : ps) {
          DTensor r = d.redistribute({c, e});
          ASSERT_EQ(r.to_local().shape(),
                    DTensor::local_shape(shape, *mesh, {c, e}, mesh->coordinate()));
          ASSERT_EQ(r.full_tensor().to_f64_vector(), full.to_f64_vector())
              << placement_str(a) << placement_str(b) << " -> " << placement_str(c)
              << placement_str(e);
        }
    }
  // Nested shards of one dim: dim 0 of 9 rows -> chunks of 5 and 4, then 3+2 and 2+2.
  DTensor n = DTensor::distribute_tensor(full, mesh, {Shard{0}, Shard{0}});
  const int64_t expect[4] = {3, 2, 2, 2};
  EXPECT_EQ(n.to_local().size(0), expect[W()->rank()]);
}

// The world ranks of a group, in the group's order.
std::vector<int64_t> members(ProcessGroup& g) {
  Tensor mine = Tensor::full({1}, double(W()->rank()), DType::i64);
  Tensor all = Tensor::empty({g.size()}, DType::i64);
  g.all_gather_into_tensor(all, mine)->wait();
  std::vector<int64_t> v;
  for (double x : all.to_f64_vector()) v.push_back(int64_t(x));
  return v;
}

// Expert parallel's mesh (dp_shard_mod_ep x ep): at np 4 with EP 2, ranks {0, 1} and {2, 3}
// exchange tokens and {0, 2}, {1, 3} hold the same experts; with EP = world, every rank exchanges
// with every other and each holds its own experts alone.
TEST(DeviceMesh, ExpertMeshGroups) {
  const int R = W()->size(), me = W()->rank();
  std::vector<int64_t> world_ranks;
  for (int r = 0; r < R; ++r) world_ranks.push_back(r);
  auto full_ep = init_expert_mesh(R);
  EXPECT_EQ(full_ep->shape(), (std::vector<int64_t>{1, R}));
  EXPECT_EQ(members(*full_ep->group("ep")), world_ranks);
  EXPECT_EQ(members(*full_ep->group("dp_shard_mod_ep")), std::vector<int64_t>{me});
  EXPECT_EQ(full_ep->group("ep")->rank(), me);
  if (R % 2 == 0) {
    auto mesh = init_expert_mesh(2);
    EXPECT_EQ(mesh->names(), (std::vector<std::string>{"dp_shard_mod_ep", "ep"}));
    const int64_t row = me / 2, col = me % 2;
    EXPECT_EQ(members(*mesh->group("ep")), (std::vector<int64_t>{2 * row, 2 * row + 1}));
    EXPECT_EQ(mesh->group("ep")->rank(), col);
    std::vector<int64_t> same_experts;
    for (int64_t r = col; r < R; r += 2) same_experts.push_back(r);
    EXPECT_EQ(members(*mesh->group("dp_shard_mod_ep")), same_experts);
    EXPECT_EQ((*mesh)["dp_shard_mod_ep"]->size(), R / 2);
  }
  try {
    init_expert_mesh(R + 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be >= 1 and divide"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fsdp::dist

int main(int argc, char** argv) { return fsdp::test::dist_test_main(argc, argv, "dist_test"); }
