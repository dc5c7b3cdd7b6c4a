#!/usr/bin/env bash
# Runs fsdp-bench-collectives on mpi (mpirun) and gloo (scripts/fsdprun) with
# 2 and 4 ranks on this machine and writes bench/results/collectives-cpu.md.
#   bench/collectives.sh [max-bytes]
set -euo pipefail
cd "$(dirname "$0")/.."
max=${1:-268435456}
[ -n "${FSDP_BENCH_NO_BUILD:-}" ] || scripts/build.sh fsdp-bench-collectives > /dev/null  # set: the build is done
bin=build/bench/fsdp-bench-collectives
out=${FSDP_BENCH_OUT:-bench/results/collectives-cpu.md}  # FSDP_BENCH_OUT: elsewhere (tests/bench_start_test.sh)
cores=$(nproc)
export OMP_NUM_THREADS=1 FSDP_DIST_CHECK=0
{
  echo "# Collective bandwidth on this CPU machine"
  echo
  echo "Run: \`bench/collectives.sh\` on $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $cores cores."
  echo "f32 tensors; times in microseconds, bandwidths in GB/s (nccl-tests' algbw and busbw)."
  echo "4 ranks share 2 cores here, so the 4-rank rows measure an oversubscribed machine."
  echo "Gloo has no reduce-scatter in its API: ours is Gloo's all-reduce plus a slice, so it moves twice the bytes."
  for np in 2 4; do
    echo
    echo "## mpi, $np ranks (mpirun --oversubscribe)"
    echo
    mpirun --allow-run-as-root --oversubscribe -np $np "$bin" --max-bytes "$max"
    echo
    echo "## gloo, $np ranks (scripts/fsdprun)"
    echo
    scripts/fsdprun --standalone --nproc_per_node $np "$bin" --max-bytes "$max" | sed -n 's/^\[rank0\]://p'
  done
} > "$out"
cat "$out"
