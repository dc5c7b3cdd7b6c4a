// Token sources: the rows of a global batch split over ranks are disjoint and
// cover it exactly, in the same order at every world size; epochs wrap;
// llm.c shards round-trip and bad ones are named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/text_dataset.h"

namespace fsdp::data {
namespace {

TEST(Batches, RanksCoverTheGlobalBatchDisjointly) {
  std::vector<int32_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i);
  TokenStream s(tokens, "iota", 8);
  const int64_t G = 12, T = 8;
  for (int64_t N : {1, 2, 3, 4}) {
    std::multiset<int32_t> starts;
    for (int64_t r = 0; r < N; ++r) {
      Batch b = s.batch(5, G, r * (G / N), G / N, T);
      for (int64_t row = 0; row < G / N; ++row) {
        starts.insert(b.inputs.data<int32_t>()[row * T]);
        EXPECT_EQ(b.targets.data<int32_t>()[row * T],
                  (b.inputs.data<int32_t>()[row * T] + 1) % 1000);
      }
    }
    std::multiset<int32_t> want;
    for (int64_t g = 0; g < G; ++g) want.insert(int32_t(((5 * G + g) * T) % 1000));
    EXPECT_EQ(starts, want) << N << " ranks";  // disjoint (no repeats) and complete
  }
  Batch wrap = s.batch(100, G, 0, 1, T);  // past the end: the epoch wraps
  EXPECT_EQ(wrap.inputs.data<int32_t>()[0], int32_t((100 * G * T) % 1000));
}

// The loader hands each rank its rows of batch p of the source, in order, from any position.
TEST(DataLoader, RanksRowsInOrderFromAnyPosition) {
  std::vector<int32_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i);
  auto s = std::make_shared<TokenStream>(tokens, "iota", 8);
  DataLoader a(s, 12, 1, 3, 8);  // rank 1 of 3: rows 4..7
  EXPECT_EQ(a.rows(), 4);
  for (int64_t p = 0; p < 3; ++p) {
    Batch got = a.next(), want = s->batch(p, 12, 4, 4, 8);
    EXPECT_EQ(got.inputs.to_f64_vector(), want.inputs.to_f64_vector()) << "batch " << p;
    EXPECT_EQ(got.targets.to_f64_vector(), want.targets.to_f64_vector());
  }
  EXPECT_EQ(a.position(), 3);
  DataLoader b(s, 12, 1, 3, 8);
  b.set_position(2);  // resuming: batch 2 again
  EXPECT_EQ(b.next().inputs.to_f64_vector(), s->batch(2, 12, 4, 4, 8).inputs.to_f64_vector());
  EXPECT_THROW(DataLoader(s, 10, 0, 3, 8), Error);  // 10 rows over 3 ranks
  EXPECT_THROW(DataLoader(s, 12, 3, 3, 8), Error);  // no rank 3
  EXPECT_THROW(b.set_position(-1), Error);
}

TEST(Batches, ShuffledEpochsAreDisjointPermutationsFromTheSeed) {
  std::vector<int32_t> tokens(8 * 10 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i);
  TokenStream s(tokens, "iota", 8), t(tokens, "iota", 8), u(tokens, "iota", 8);
  s.set_shuffle(7, 8);
  t.set_shuffle(7, 8);
  u.set_shuffle(8, 8);
  std::set<int32_t> epoch0;
  for (int64_t step = 0; step < 5; ++step)
    for (int64_t r = 0; r < 2; ++r) {  // 2 ranks x 1 row, 10 windows per epoch
      Batch b = s.batch(step, 2, r, 1, 8);
      EXPECT_EQ(b.inputs.data<int32_t>()[0] % 8, 0);
      epoch0.insert(b.inputs.data<int32_t>()[0]);
      EXPECT_EQ(t.batch(step, 2, r, 1, 8).inputs.data<int32_t>()[0],
                b.inputs.data<int32_t>()[0]);  // same seed, same order
    }
  EXPECT_EQ(epoch0.size(), 10u);  // every window once
  bool differs = false;
  for (int64_t step = 0; step < 5; ++step)
    differs |= u.batch(step, 2, 0, 1, 8).inputs.data<int32_t>()[0] !=
               s.batch(step, 2, 0, 1, 8).inputs.data<int32_t>()[0];
  EXPECT_TRUE(differs);  // another seed, another order
}

TEST(Shards, RoundTripAndErrors) {
  const auto dir =
      std::filesystem::path(::testing::TempDir()) / ("fsdp_shards_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  write_bin_shard((dir / "a.bin").string(), {1, 2, 3, 4, 5});
  write_bin_shard((dir / "b.bin").string(), {6, 7, 8});
  auto s = open_token_stream(dir.string(), 256, 4);
  EXPECT_EQ(s->tokens(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  auto g = open_token_stream((dir / "*.bin").string(), 256, 4);
  EXPECT_EQ(g->tokens().size(), 8u);
  EXPECT_THROW(open_token_stream(dir.string(), 8, 4), Error);  // id 8 is not below vocab 8
  auto [train, val] = s->split_tail(0.25, 1);
  EXPECT_EQ(train->tokens().size(), 6u);
  EXPECT_EQ(val->tokens(), (std::vector<int32_t>{7, 8}));
  EXPECT_THROW(open_token_stream((dir / "none*.bin").string(), 256, 4), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fsdp::data
