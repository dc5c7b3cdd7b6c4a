// fsdp-bench-collectives: nccl-tests-style bandwidth of all-gather,
// reduce-scatter and all-reduce through fsdp.cpp's process groups, by message
// size, set against a plain memcpy measured in the same run (the local
// limit). Sizes are nccl-tests': the all-gather output, the reduce-scatter
// input, the all-reduce buffer. algbw = size / time; busbw scales it by
// (n-1)/n (gather, scatter) or 2(n-1)/n (all-reduce), the bytes each rank
// must move. Times are the mean over iterations, averaged over ranks.
//   mpirun -np 4 fsdp-bench-collectives
//   scripts/fsdprun --nproc_per_node 4 fsdp-bench-collectives
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/distributed/init.h"

using namespace fsdp;
using Clock = std::chrono::steady_clock;

namespace {

double memcpy_gbps(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::memcpy(b.data(), a.data(), bytes);  // fault the pages in
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return double(bytes) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t min_bytes = 4 << 10, max_bytes = 256 << 20;
  int max_iters = 20;
  CLI::App app{"fsdp-bench-collectives: collective bandwidth by message size"};
  app.add_option("--min-bytes", min_bytes, "smallest message")->capture_default_str();
  app.add_option("--max-bytes", max_bytes, "largest message")->capture_default_str();
  app.add_option("--iters", max_iters, "most timed iterations per size")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    auto pg = dist::init_process_group();
    const int n = pg->size(), me = pg->rank();
    const double local_gbps = memcpy_gbps(size_t(std::max<int64_t>(max_bytes, 64 << 20)));
    if (me == 0) {
      fmt::print("backend {} | ranks {} | memcpy {:.2f} GB/s (one thread, {} MiB)\n\n",
                 pg->backend(), n, local_gbps, std::max<int64_t>(max_bytes, 64 << 20) >> 20);
      fmt::print("| {:>10} | {:>10} {:>8} {:>8} | {:>10} {:>8} {:>8} | {:>10} {:>8} {:>8} |\n",
                 "size", "ag us", "algbw", "busbw", "rs us", "algbw", "busbw", "ar us", "algbw",
                 "busbw");
      fmt::print("|{:-<12}|{:-<30}|{:-<30}|{:-<30}|\n", "", "", "", "");
    }
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
      const int64_t count = bytes / 4 / n * n;  // f32 elements, divisible by the ranks
      if (count == 0) continue;
      const int64_t real_bytes = count * 4;
      Tensor full = Tensor::full({count}, 1.0, DType::f32);
      Tensor part = Tensor::full({count / n}, 1.0, DType::f32);
      const int iters = int(std::clamp<int64_t>((int64_t(256) << 20) / real_bytes, 2, max_iters));
      auto time_it = [&](auto&& op) {
        op()->wait();  // warm-up
        pg->barrier()->wait();
        auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) op()->wait();
        Tensor t = Tensor::full(
            {1}, std::chrono::duration<double>(Clock::now() - t0).count() / iters, DType::f64);
        pg->all_reduce(t, dist::ReduceOp::AVG)->wait();
        return t.item();
      };
      const double ag = time_it([&] { return pg->all_gather_into_tensor(full, part); });
      const double rs =
          time_it([&] { return pg->reduce_scatter_tensor(part, full, dist::ReduceOp::SUM); });
      const double ar = time_it([&] { return pg->all_reduce(full, dist::ReduceOp::SUM); });
      if (me == 0) {
        const double f = double(n - 1) / n, gb = double(real_bytes) / 1e9;
        fmt::print(
            "| {:>10} | {:>10.1f} {:>8.2f} {:>8.2f} | {:>10.1f} {:>8.2f} {:>8.2f} | {:>10.1f} "
            "{:>8.2f} {:>8.2f} |\n",
            real_bytes, ag * 1e6, gb / ag, gb / ag * f, rs * 1e6, gb / rs, gb / rs * f, ar * 1e6,
            gb / ar, gb / ar * 2 * f);
      }
    }
    dist::destroy_process_group();
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "fsdp-bench-collectives: error: {}\n", e.what());
    dist::abort_process(1);
  }
}
