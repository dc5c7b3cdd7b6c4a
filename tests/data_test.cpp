// Token sources: the rows of a global batch split over ranks are disjoint and
// cover it exactly, in the same order at every world size; epochs wrap; the
// shuffle is a bijection per epoch; memory-mapped llm.c shards (uint16 and
// uint32) give exactly the batches of the in-memory reader they replaced (its
// logic is kept below as the reference), and bad ones are named.
#include <fcntl.h>
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/core/tensor.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/preference.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/ops/ops.h"

namespace fsdp::data {
namespace {

TEST(Batches, RanksCoverTheGlobalBatchDisjointly) {
  std::vector<int32_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i);
  TokenVector s(tokens, "iota", 8);
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
  auto s = std::make_shared<TokenVector>(tokens, "iota", 8);
  DataLoader a(s, 12, 1, 3, 8);  // rank 1 of 3: rows 4..7
  EXPECT_EQ(a.rows(), 4);
  for (int64_t p = 0; p < 3; ++p) {
    Batch got = a.next(), want = s->batch(p, 12, 4, 4, 8);
    EXPECT_EQ(got.inputs.to_f64_vector(), want.inputs.to_f64_vector()) << "batch " << p;
    EXPECT_EQ(got.targets.to_f64_vector(), want.targets.to_f64_vector());
  }
  EXPECT_EQ(a.position(), 36);  // windows handed out over all ranks: 3 batches of 12
  DataLoader b(s, 12, 1, 3, 8);
  b.set_position(24);  // resuming after 24 windows: batch 2 again
  EXPECT_EQ(b.next().inputs.to_f64_vector(), s->batch(2, 12, 4, 4, 8).inputs.to_f64_vector());
  EXPECT_THROW(DataLoader(s, 10, 0, 3, 8), Error);  // 10 rows over 3 ranks
  EXPECT_THROW(DataLoader(s, 12, 3, 3, 8), Error);  // no rank 3
  EXPECT_THROW(b.set_position(-1), Error);
}

// The position counts windows, not batches: a run that read 2 batches of 4 windows on 1 rank
// and resumes with 2 ranks of 6 rows each reads windows 8..19 next, none skipped or repeated
// (with a batch index it would have read 24..35), shuffled or not.
TEST(DataLoader, ResumeAtAnotherBatchOrWorldSizeReadsTheNextUnreadWindow) {
  std::vector<int32_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i % 1000);
  for (bool shuffle : {false, true}) {
    auto s = std::make_shared<TokenVector>(tokens, "iota", 8);
    if (shuffle) s->set_shuffle(5, 8);
    DataLoader first(s, 4, 0, 1, 8);
    first.next();
    first.next();
    ASSERT_EQ(first.position(), 8);
    for (int rank = 0; rank < 2; ++rank) {
      DataLoader resumed(s, 12, rank, 2, 8);
      resumed.set_position(first.position());
      const Batch got = resumed.next();
      const Batch want = s->windows(8 + 6 * rank, 6, 8);
      EXPECT_EQ(got.inputs.to_f64_vector(), want.inputs.to_f64_vector())
          << "shuffle " << shuffle << " rank " << rank;
      EXPECT_EQ(got.targets.to_f64_vector(), want.targets.to_f64_vector());
      EXPECT_EQ(resumed.position(), 20);
    }
  }
}

TEST(Batches, ShuffledEpochsAreDisjointPermutationsFromTheSeed) {
  std::vector<int32_t> tokens(8 * 10 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i);
  TokenVector s(tokens, "iota", 8), t(tokens, "iota", 8), u(tokens, "iota", 8);
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

// The Feistel shuffle: every window exactly once per epoch, for sizes around powers of two
// (cycle-walking), the same order for the same key, another for another epoch or seed.
TEST(Shuffle, FeistelIsABijectionPerEpochAndDeterministic) {
  for (int64_t windows : {1, 2, 3, 4, 5, 7, 10, 63, 64, 65, 255, 1000, 4097, 100003}) {
    for (int64_t epoch : {0, 1, 5}) {
      std::vector<char> seen(size_t(windows), 0);
      for (int64_t i = 0; i < windows; ++i) {
        const int64_t w = shuffle_window(i, windows, 42, epoch);
        ASSERT_TRUE(w >= 0 && w < windows) << w << " of " << windows;
        ASSERT_FALSE(seen[size_t(w)]) << "window " << w << " twice, " << windows << " windows";
        seen[size_t(w)] = 1;
        ASSERT_EQ(shuffle_window(i, windows, 42, epoch), w);  // deterministic
      }
    }
  }
  const int64_t W = 1000;
  int64_t other_epoch = 0, other_seed = 0, fixed = 0;
  for (int64_t i = 0; i < W; ++i) {
    other_epoch += shuffle_window(i, W, 42, 0) != shuffle_window(i, W, 42, 1);
    other_seed += shuffle_window(i, W, 42, 0) != shuffle_window(i, W, 43, 0);
    fixed += shuffle_window(i, W, 42, 0) == i;
  }
  EXPECT_GT(other_epoch, W * 9 / 10);
  EXPECT_GT(other_seed, W * 9 / 10);
  EXPECT_LT(fixed, 20);  // a permutation, not the identity
  // The order is part of a run's identity (a resumed run must see the same data): pinned.
  std::vector<int64_t> order;
  for (int64_t i = 0; i < 10; ++i) order.push_back(shuffle_window(i, 10, 7, 0));
  EXPECT_EQ(order, (std::vector<int64_t>{6, 3, 1, 8, 7, 9, 0, 5, 4, 2}));
  EXPECT_THROW(shuffle_window(10, 10, 7, 0), Error);
}

// The in-memory reader the mapped shards replaced (all tokens in one vector), kept as the
// reference: row q starts at (q*T) % n, or at window shuffle_window(...) when shuffled, and reads
// T + 1 tokens wrapping at n.
Batch reference_batch(const std::vector<int32_t>& tokens, bool shuffle, uint64_t seed, int64_t step,
                      int64_t global_rows, int64_t row_begin, int64_t rows, int64_t seq) {
  Batch b{Tensor::empty({rows, seq}, DType::i32), Tensor::empty({rows, seq}, DType::i32)};
  int32_t* in = b.inputs.data<int32_t>();
  int32_t* tg = b.targets.data<int32_t>();
  const int64_t n = int64_t(tokens.size());
  const int64_t windows = std::max<int64_t>(1, (n - 1) / seq);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t q = step * global_rows + row_begin + r;
    int64_t start = (q * seq) % n;
    if (shuffle) start = shuffle_window(q % windows, windows, seed, q / windows) * seq;
    for (int64_t t = 0; t < seq; ++t) {
      in[r * seq + t] = tokens[size_t((start + t) % n)];
      tg[r * seq + t] = tokens[size_t((start + t + 1) % n)];
    }
  }
  return b;
}

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name)
      : path(std::filesystem::path(::testing::TempDir()) /
             (name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

// A small corpus over five shards of uneven sizes (one empty), 16- or 32-bit, so that rows
// cross shard boundaries and the end of the data.
std::vector<int32_t> write_corpus(const TempDir& dir, bool wide) {
  std::vector<int32_t> all;
  const int64_t sizes[] = {37, 0, 101, 5, 58};
  uint32_t x = 12345;
  for (int s = 0; s < 5; ++s) {
    std::vector<uint16_t> t16;
    std::vector<uint32_t> t32;
    for (int64_t i = 0; i < sizes[s]; ++i) {
      x = x * 1664525u + 1013904223u;
      const uint32_t id = wide ? (x >> 8) % 128256 : (x >> 8) % 50257;
      all.push_back(int32_t(id));
      t16.push_back(uint16_t(id));
      t32.push_back(id);
    }
    const std::string path = dir / ("shard_" + std::to_string(s) + ".bin");
    if (wide)
      write_bin_shard_u32(path, t32);
    else
      write_bin_shard(path, t16);
  }
  return all;
}

void expect_same(const Batch& got, const Batch& want, const std::string& what) {
  EXPECT_EQ(got.inputs.to_f64_vector(), want.inputs.to_f64_vector()) << what;
  EXPECT_EQ(got.targets.to_f64_vector(), want.targets.to_f64_vector()) << what;
}

TEST(Shards, MappedBatchesEqualTheInMemoryReader) {
  for (bool wide : {false, true}) {
    TempDir dir(wide ? "fsdp_map32" : "fsdp_map16");
    const std::vector<int32_t> all = write_corpus(dir, wide);
    const int64_t vocab = wide ? 128256 : 50304, T = 8, G = 6;
    for (bool shuffle : {false, true}) {
      const std::string what = fmt::format("{}-bit, shuffle {}", wide ? 32 : 16, shuffle);
      auto s = std::shared_ptr<TokenStream>(open_token_stream(dir.path.string(), vocab, T));
      EXPECT_NE(s->describe().find(wide ? "uint32" : "uint16"), std::string::npos);
      EXPECT_EQ(s->size(), int64_t(all.size()));
      EXPECT_EQ(s->read(0, s->size()), all);
      if (shuffle) s->set_shuffle(11, T);
      // 3 ranks x 2 rows, 30 steps: about 7 epochs of 25 windows.
      for (int rank = 0; rank < 3; ++rank) {
        DataLoader loader(s, G, rank, 3, T);
        for (int64_t p = 0; p < 30; ++p)
          expect_same(loader.next(), reference_batch(all, shuffle, 11, p, G, rank * 2, 2, T),
                      what + fmt::format(", rank {} batch {}", rank, p));
        DataLoader resumed(s, G, rank, 3, T);  // a resume: set_position() then the same batches
        resumed.set_position(17 * G);
        for (int64_t p = 17; p < 22; ++p)
          expect_same(resumed.next(), reference_batch(all, shuffle, 11, p, G, rank * 2, 2, T),
                      what + fmt::format(", resumed rank {} batch {}", rank, p));
      }
      // The validation split is a view of the same mapping.
      auto [train, val] = s->split_tail(0.25, T);
      const size_t cut = size_t(double(all.size()) * 0.75);
      EXPECT_EQ(train->read(0, train->size()),
                std::vector<int32_t>(all.begin(), all.begin() + long(cut)));
      EXPECT_EQ(val->read(0, val->size()),
                std::vector<int32_t>(all.begin() + long(cut), all.end()));
      const std::vector<int32_t> tail(all.begin() + long(cut), all.end());
      for (int64_t p = 0; p < 10; ++p)
        expect_same(val->batch(p, 2, 0, 2, T), reference_batch(tail, false, 0, p, 2, 0, 2, T),
                    what + " val");
    }
  }
}

TEST(Shards, RoundTripAndErrors) {
  TempDir dir("fsdp_shards");
  write_bin_shard(dir / "a.bin", {1, 2, 3, 4, 5});
  write_bin_shard(dir / "b.bin", {6, 7, 8});
  auto s = open_token_stream(dir.path.string(), 256, 4);
  EXPECT_EQ(s->read(0, s->size()), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(s->read(6, 4), (std::vector<int32_t>{7, 8, 1, 2}));  // wraps
  auto g = open_token_stream(dir / "*.bin", 256, 4);
  EXPECT_EQ(g->size(), 8);
  auto [train, val] = s->split_tail(0.25, 1);
  EXPECT_EQ(train->size(), 6);
  EXPECT_EQ(val->read(0, 2), (std::vector<int32_t>{7, 8}));
  EXPECT_THROW(open_token_stream(dir / "none*.bin", 256, 4), Error);
  // A token id the vocab cannot hold is refused when a batch reads it, by shard and position.
  auto small = open_token_stream(dir.path.string(), 8, 4);
  EXPECT_NO_THROW(small->batch(0, 1, 0, 1, 4));  // tokens 1..5
  try {
    small->batch(1, 1, 0, 1, 4);  // tokens 5..9: id 8
    ADD_FAILURE() << "id 8 read with vocab 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("b.bin': token id 8 at position 2 is not below vocab 8"),
              std::string::npos)
        << e.what();
  }
  // 32-bit: ids past 65535 read back, and are refused past the vocab.
  write_bin_shard_u32(dir / "wide.bin", {70000, 128255, 3, 4, 5});
  auto w = open_token_stream(dir / "wide.bin", 128256, 4);
  EXPECT_EQ(w->read(0, 2), (std::vector<int32_t>{70000, 128255}));
  auto w_small = open_token_stream(dir / "wide.bin", 65536, 4);
  EXPECT_THROW(w_small->batch(0, 1, 0, 1, 4), Error);
}

// The mapping's pages go back after each row: reading windows spread over a 256 MB shard (a
// sparse file: a header, then a hole of token 0) leaves this process' file-backed resident
// memory where it was, where keeping them mapped would add the 32 MB read.
int64_t rss_file_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("RssFile:", 0) == 0) return std::stoll(line.substr(8));
  return -1;
}

TEST(Shards, ReadPagesAreHandedBack) {
  TempDir dir("fsdp_rss");
  const int64_t tokens = 128 << 20, seq = 64 << 10;  // 256 MB of uint16; rows of 128 KB
  {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = int32_t(tokens);
    std::ofstream f(dir / "big.bin", std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
  }
  std::filesystem::resize_file(dir / "big.bin", 1024 + 2 * tokens);
  auto s = open_token_stream(dir / "big.bin", 256, seq);
  s->batch(255, 8, 0, 1, seq);  // the code's own pages in first
  const int64_t before = rss_file_kb();
  ASSERT_GE(before, 0) << "no RssFile in /proc/self/status";
  for (int64_t step = 0; step < 256; ++step)  // one row per MB (every 8th window)
    s->batch(step, 8, 0, 1, seq);
  const int64_t grown = rss_file_kb() - before;
  EXPECT_LT(grown, 4 << 10) << "file-backed resident memory grew by " << grown << " kB";
}

// Headers are checked when the shards are opened; each refusal names the file and the field.
TEST(Shards, BadHeadersAreRefusedByName) {
  TempDir dir("fsdp_bad_shards");
  auto write = [&](const std::string& name, std::vector<int32_t> header, size_t token_bytes) {
    header.resize(256, 0);
    std::ofstream f(dir / name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    f << std::string(token_bytes, '\0');
    return dir / name;
  };
  auto refused = [&](const std::string& path, const std::string& needle) {
    try {
      open_token_stream(path, 256, 4);
      ADD_FAILURE() << path << " opened; expected: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  };
  refused(write("magic.bin", {12345, 1, 10}, 20), "has magic 12345; expected 20240520");
  refused(write("v2.bin", {20240520, 2, 10}, 20), "has version 2; expected 1 for magic 20240520");
  refused(write("v1wide.bin", {20240801, 1, 10}, 40),
          "has version 1; expected 7 for magic 20240801");
  refused(write("short.bin", {20240520, 1, 10}, 19), "promises 10 tokens but holds 9 (truncated?)");
  refused(write("short32.bin", {20240801, 7, 10}, 39), "promises 10 tokens but holds 9");
  refused(write("negative.bin", {20240520, 1, -5}, 20), "promises -5 tokens");
  {
    std::ofstream f(dir / "header.bin", std::ios::binary);
    f << std::string(100, 'x');
  }
  refused(dir / "header.bin", "is shorter than its 1024-byte header");
  refused(write("few.bin", {20240520, 1, 3}, 6), "has 3 tokens; need at least seq + 1 = 5");
}

// The data is named by content: a byte-identical copy at another path has the same identity, a
// changed token (sampled) or a changed size another, and a folder of shards is all its files.
TEST(Shards, DataIdentityIsTheContentNotThePath) {
  TempDir dir("identity");
  std::vector<uint16_t> tokens(50000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t(i % 251);
  std::filesystem::create_directories(dir.path / "a");
  std::filesystem::create_directories(dir.path / "b");
  write_bin_shard((dir.path / "a" / "train_000000.bin").string(), tokens);
  write_bin_shard((dir.path / "b" / "train_000000.bin").string(), tokens);
  const DataIdentity a = data_identity((dir.path / "a").string());
  EXPECT_EQ(a.files, 1);
  EXPECT_EQ(a.bytes, 1024 + 2 * int64_t(tokens.size()));
  EXPECT_EQ(a.hash, data_identity((dir.path / "b" / "train_*.bin").string()).hash);
  EXPECT_EQ(a.str(), data_identity((dir.path / "b").string()).str());
  tokens[0] = 7;  // the first token: inside the sampled header page
  write_bin_shard((dir.path / "b" / "train_000000.bin").string(), tokens);
  EXPECT_NE(a.hash, data_identity((dir.path / "b").string()).hash);
  tokens.push_back(1);
  write_bin_shard((dir.path / "b" / "train_000000.bin").string(), tokens);
  EXPECT_NE(a.bytes, data_identity((dir.path / "b").string()).bytes);
  write_bin_shard((dir.path / "a" / "train_000001.bin").string(), tokens);
  EXPECT_EQ(data_identity((dir.path / "a").string()).files, 2);
  EXPECT_THROW(data_identity((dir.path / "missing.txt").string()), Error);
}

// The full hash is cached by every file's path, inode, size, mtime and ctime: a settled file (2 s
// old) is looked up, and a rewrite of the same size with its mtime set back has a new ctime, so
// it is hashed again, once settled too. (A file under 2 s old is hashed every time: a rewrite in
// the same clock tick keeps its times.)
TEST(Shards, TheFullHashIsCachedBySizeAndTimesAndARewriteIsHashedAgain) {
  TempDir dir("hash_cache");
  struct CacheDir {  // FSDP_CACHE_DIR for this test, restored after it on every path
    std::optional<std::string> was;
    explicit CacheDir(const std::string& d) {
      if (const char* w = std::getenv("FSDP_CACHE_DIR")) was = w;
      ::setenv("FSDP_CACHE_DIR", d.c_str(), 1);
    }
    ~CacheDir() {
      if (was) ::setenv("FSDP_CACHE_DIR", was->c_str(), 1);
      else ::unsetenv("FSDP_CACHE_DIR");
    }
  } cache_dir((dir.path / "cache").string());
  const std::string f = (dir.path / "text.txt").string();
  std::ofstream(f) << std::string(100000, 'a');
  const DataIdentity fresh = data_identity(f);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // only ever makes it older
  EXPECT_EQ(data_identity(f).str(), fresh.str());
  const std::string cache = (dir.path / "cache" / "data_hashes.json").string();
  ASSERT_TRUE(std::filesystem::exists(cache));
  // The cache is what answers now: an entry edited by hand is believed while the file is unchanged.
  std::string text((std::istreambuf_iterator<char>(std::ifstream(cache).rdbuf())), {});
  const std::string want = fmt::format("{:016x}", fresh.hash);
  ASSERT_NE(text.find(want), std::string::npos) << text;
  text.replace(text.find(want), want.size(), "00000000000000ab");
  std::ofstream(cache) << text;
  EXPECT_EQ(data_identity(f).hash, 0xabu);
  // Another byte at the same size, with the old mtime put back: only the ctime moved.
  struct stat st {};
  ASSERT_EQ(::stat(f.c_str(), &st), 0);
  std::ofstream(f) << std::string(99999, 'a') << 'b';
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, f.c_str(), times, 0), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // settled: the cache is consulted
  const DataIdentity changed = data_identity(f);
  EXPECT_NE(changed.hash, 0xabu) << "the rewrite was answered from the cache";
  EXPECT_NE(changed.hash, fresh.hash);
  EXPECT_EQ(changed.bytes, fresh.bytes);
  EXPECT_EQ(data_identity(f).str(), changed.str());  // now cached, under the new times
}

// Samples one per row (chat SFT): the inputs are the sample then padding, the targets the next
// token where it is a label and fsdp::kIgnoreIndex elsewhere (the padding, the unlabeled tokens, the
// tokens past the cut at seq + 1); rows wrap over the samples, and the shuffle visits each sample
// once per epoch.
TEST(Samples, RowsArePaddedCutAndMaskedWhereTheLabelsSay) {
  const int32_t I = int32_t(fsdp::kIgnoreIndex);
  std::vector<TokenizedSample> s = {{{5, 6, 7}, {0, 1, 1}},
                                    {{1, 2, 3, 4, 5, 6, 7}, {0, 0, 1, 1, 0, 1, 1}},
                                    {{9, 8}, {0, 0}}};
  SampleSource src(s, "three samples", 0, 4);
  EXPECT_EQ(src.targets(), 6);
  EXPECT_EQ(src.longer_than(4), 1);  // 7 tokens > 5
  EXPECT_TRUE(src.masks_targets());
  Batch b = src.windows(0, 4, 4);
  const std::vector<int32_t> in(b.inputs.data<int32_t>(), b.inputs.data<int32_t>() + 16),
      tg(b.targets.data<int32_t>(), b.targets.data<int32_t>() + 16);
  EXPECT_EQ(in, (std::vector<int32_t>{5, 6, 7, 0, 1, 2, 3, 4, 9, 8, 0, 0, 5, 6, 7, 0}));
  EXPECT_EQ(tg, (std::vector<int32_t>{6, 7, I, I, I, 3, 4, I, I, I, I, I, 6, 7, I, I}));
  DataLoader loader(std::make_shared<SampleSource>(s, "three", 0, 4), 4, 1, 2, 4);
  EXPECT_EQ(loader.count_targets(1), 2);  // rows 2 and 3: none, then 6 and 7
  src.set_shuffle(3);
  std::set<int32_t> first;
  const Batch e = src.windows(3, 3, 4);  // epoch 1
  for (int r = 0; r < 3; ++r) first.insert(e.inputs.data<int32_t>()[r * 4]);
  EXPECT_EQ(first, (std::set<int32_t>{5, 1, 9}));
  auto [train, val] = src.split_tail(0.34);
  EXPECT_EQ(train->size(), 2);
  EXPECT_EQ(val->size(), 1);
  EXPECT_EQ(val->windows(0, 1, 4).inputs.data<int32_t>()[0], 9);
}

// A token stream (text or llm.c shards) packs by documents: each ends after an EOS token (here
// 0), every token of it a target, and whole documents fill the rows as samples do. Only the
// documents' starts are kept; the tokens are read from the stream per batch.
TEST(Packing, AStreamPacksItsDocumentsSplitAfterEachEos) {
  const int32_t I = int32_t(fsdp::kIgnoreIndex);
  auto stream = std::make_shared<TokenVector>(
      std::vector<int32_t>{5, 6, 0, 7, 8, 9, 0, 3, 4, 1, 2, 3, 4, 5, 6, 0, 0, 8}, "eighteen tokens",
      4);
  // documents: [5 6 0] [7 8 9 0] [3 4 1 2 3 4 5 6 0] [0] [8]: 2, 3, 8, 0 and 0 positions
  std::unique_ptr<PackedSource> p = PackedSource::of_documents(stream, 0, 4);
  EXPECT_EQ(p->samples(), 3);
  EXPECT_EQ(p->split(), 1);  // 8 positions > 4
  // rows: [5 6 | pad pad], [7 8 9 | pad], [3 4 1 2], [3 4 5 6]
  ASSERT_EQ(p->rows(), 4);
  EXPECT_NEAR(p->fill(), 13.0 / 16.0, 1e-12);
  Batch b = p->windows(0, 4, 4);
  auto vec = [](const Tensor& t) {
    return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  };
  EXPECT_EQ(vec(b.inputs), (std::vector<int32_t>{5, 6, 0, 0, 7, 8, 9, 0, 3, 4, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(vec(b.targets), (std::vector<int32_t>{6, 0, I, I, 8, 9, 0, I, 4, 1, 2, 3, 4, 5, 6, 0}));
  EXPECT_EQ(vec(b.doc_start),
            (std::vector<int32_t>{0, 0, 2, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_NO_THROW(ops::check_doc_start(b.doc_start, 4, 4));
  EXPECT_NE(p->describe().find("3 documents packed into 4 rows"), std::string::npos)
      << p->describe();
  // No EOS at all: one document, split into pieces of the row.
  std::unique_ptr<PackedSource> q = PackedSource::of_documents(stream, 99, 4);
  EXPECT_EQ(q->samples(), 1);
  EXPECT_EQ(q->rows(), 5);  // 17 positions
}

// Packed rows: whole samples in order fill each row (a sample of n tokens takes n - 1 positions),
// the rest is padding that is no target and a document of its own; a sample longer than the row
// is split into pieces, each its own document; doc_start names each position's document start.
// The shuffle visits every packed row once per epoch.
TEST(Packing, WholeSamplesFillRowsAndEachPositionKnowsItsDocument) {
  const int32_t I = int32_t(fsdp::kIgnoreIndex);
  std::vector<TokenizedSample> s = {{{5, 6, 7}, {0, 1, 1}},
                                    {{1, 2, 3}, {0, 0, 1}},
                                    {{9}, {1}},  // one token: no position, skipped
                                    {{1, 2, 3, 4, 5, 6, 7}, {0, 0, 1, 1, 0, 1, 1}},
                                    {{8, 9}, {0, 1}}};
  std::unique_ptr<PackedSource> p = SampleSource(s, "five samples", 0, 4).packed();
  EXPECT_EQ(p->samples(), 4);
  EXPECT_EQ(p->split(), 1);  // 6 positions > 4
  EXPECT_TRUE(p->masks_targets());
  // rows: [5 6 | 1 2], [1 2 3 4], [5 6 | 8 pad]
  ASSERT_EQ(p->rows(), 3);
  EXPECT_NEAR(p->fill(), 11.0 / 12.0, 1e-12);
  Batch b = p->windows(0, 3, 4);
  auto vec = [](const Tensor& t) {
    return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  };
  EXPECT_EQ(vec(b.inputs), (std::vector<int32_t>{5, 6, 1, 2, 1, 2, 3, 4, 5, 6, 8, 0}));
  EXPECT_EQ(vec(b.targets), (std::vector<int32_t>{6, 7, I, 3, I, 3, 4, I, 6, 7, 9, I}));
  EXPECT_EQ(vec(b.doc_start), (std::vector<int32_t>{0, 0, 2, 2, 0, 0, 0, 0, 0, 0, 2, 3}));
  EXPECT_NO_THROW(ops::check_doc_start(b.doc_start, 3, 4));
  EXPECT_THROW(p->windows(0, 1, 5), Error);  // packed for 4 positions
  DataLoader loader(std::shared_ptr<PackedSource>(std::move(p)), 2, 1, 2, 4);
  EXPECT_EQ(loader.count_targets(1), 2);  // rank 1's row: the [1 2 3 4] piece, targets 3 and 4
  std::unique_ptr<PackedSource> q = SampleSource(s, "five samples", 0, 4).packed();
  q->set_shuffle(7);
  std::set<int32_t> firsts;
  const Batch e = q->windows(6, 3, 4);  // epoch 2
  for (int r = 0; r < 3; ++r) firsts.insert(e.doc_start.data<int32_t>()[r * 4 + 3]);
  EXPECT_EQ(firsts, (std::set<int32_t>{2, 0, 3}));
  // A doc_start that breaks the rule is refused, naming the place.
  Tensor bad = Tensor::from_vector(std::vector<int32_t>{0, 0, 1, 0}, {1, 4});
  try {
    ops::check_doc_start(bad, 1, 4);
    ADD_FAILURE() << "accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("row 0 position 2: 1"), std::string::npos) << err.what();
  }
}

// A pair's rows (data/preference.h) under both of TRL's truncation modes, at --seq 4 (5 tokens a
// row): keep_start keeps a long sequence's first tokens, keep_end its last (the prompt's start
// goes), each row on its own; the targets are the reply's tokens in the row, and a sequence that
// fits is the same either way, padded.
TEST(PreferenceRows, KeepStartAndKeepEnd) {
  constexpr int32_t X = int32_t(kIgnoreIndex);
  const std::vector<PreferencePair> pairs{
      {{1, 2, 3, 4}, {5, 6, 7}, {8}}, {{1, 2, 3, 4, 5, 6}, {7}, {9}}, {{1}, {2}, {3}}};
  struct Want {
    std::vector<int32_t> inputs, targets;
  };
  const auto rows = [&](bool keep_end) {
    const PreferenceSource src(pairs, "pairs", 0, 4, keep_end);
    const Batch b = src.windows(0, 6, 4);
    return std::pair{b.inputs.to_f64_vector(), b.targets.to_f64_vector()};
  };
  const auto flat = [](const std::vector<Want>& w, bool targets) {
    std::vector<double> out;
    for (const Want& r : w)
      for (int32_t v : targets ? r.targets : r.inputs) out.push_back(v);
    return out;
  };
  const std::vector<Want> start{{{1, 2, 3, 4}, {X, X, X, 5}},  {{1, 2, 3, 4}, {X, X, X, 8}},
                                {{1, 2, 3, 4}, {X, X, X, X}},  {{1, 2, 3, 4}, {X, X, X, X}},
                                {{1, 2, 0, 0}, {2, X, X, X}},  {{1, 3, 0, 0}, {3, X, X, X}}};
  const std::vector<Want> end{{{3, 4, 5, 6}, {X, 5, 6, 7}},  {{1, 2, 3, 4}, {X, X, X, 8}},
                              {{3, 4, 5, 6}, {X, X, X, 7}},  {{3, 4, 5, 6}, {X, X, X, 9}},
                              {{1, 2, 0, 0}, {2, X, X, X}},  {{1, 3, 0, 0}, {3, X, X, X}}};
  EXPECT_EQ(rows(false).first, flat(start, false));
  EXPECT_EQ(rows(false).second, flat(start, true));
  EXPECT_EQ(rows(true).first, flat(end, false));
  EXPECT_EQ(rows(true).second, flat(end, true));
  const std::string what = PreferenceSource(pairs, "pairs", 0, 4, true).describe();
  EXPECT_NE(what.find("2 truncated at --seq 4 + 1 keeping their ends"), std::string::npos) << what;
}

// Precomputed reference log-probs (--pref-precompute-ref): pair_rows gives pairs in the file's
// order whatever the shuffle (wrapping past the last), and windows() hands out each row's value
// with its pair, shuffled or not; a count other than 2 a pair is refused; the content hash
// changes with the tokens, the seq and the truncation.
TEST(PreferenceRows, ReferenceLogpsFollowTheirPairs) {
  std::vector<PreferencePair> pairs;
  for (int32_t k = 0; k < 5; ++k) pairs.push_back({{1}, {int32_t(10 + k)}, {int32_t(20 + k)}});
  PreferenceSource src(pairs, "pairs", 0, 4);
  EXPECT_THROW(src.set_reference({1.0, 2.0}), Error);
  std::vector<double> ref;
  for (int k = 0; k < 5; ++k) ref.insert(ref.end(), {-double(k) - 0.25, -double(k) - 0.75});
  src.set_reference(ref);
  src.set_shuffle(7);
  const Batch all = src.pair_rows(3, 4, 4);  // pairs 3, 4, 0, 1
  const std::vector<double> in = all.inputs.to_f64_vector();
  EXPECT_EQ(in[1], 13);  // row 0: the chosen reply of pair 3 after its prompt
  EXPECT_EQ(in[4 * 3 + 1], 24);
  EXPECT_EQ(in[4 * 4 + 1], 10);
  EXPECT_TRUE(all.reference_logps.empty());
  for (int64_t first = 0; first < 20; first += 4) {  // two epochs, shuffled
    const Batch b = src.windows(first, 4, 4);
    ASSERT_EQ(b.reference_logps.size(), 4u);
    const std::vector<double> x = b.inputs.to_f64_vector();
    for (int r = 0; r < 4; ++r) {
      const int k = int(x[size_t(4 * r + 1)]) % 10;  // the pair's index from its reply token
      EXPECT_EQ(b.reference_logps[size_t(r)], ref[size_t(2 * k + r % 2)]) << first << " " << r;
    }
  }
  // A DataLoader's rank gets its rows' values with them.
  DataLoader loader(std::make_shared<PreferenceSource>(src), 4, 1, 2, 4, Device::cpu());
  const Batch mine = loader.next(), whole = src.windows(0, 4, 4);
  ASSERT_EQ(mine.reference_logps.size(), 2u);
  EXPECT_EQ(mine.reference_logps[0], whole.reference_logps[2]);
  EXPECT_EQ(mine.reference_logps[1], whole.reference_logps[3]);
  const uint64_t h = PreferenceSource(pairs, "pairs", 0, 4).content_hash();
  EXPECT_EQ(h, PreferenceSource(pairs, "other name", 0, 4).content_hash());
  EXPECT_NE(h, PreferenceSource(pairs, "pairs", 0, 5).content_hash());
  EXPECT_NE(h, PreferenceSource(pairs, "pairs", 0, 4, true).content_hash());
  pairs[4].rejected.push_back(3);
  EXPECT_NE(h, PreferenceSource(pairs, "pairs", 0, 4).content_hash());
}

}  // namespace
}  // namespace fsdp::data
