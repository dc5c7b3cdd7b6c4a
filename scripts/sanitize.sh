#!/usr/bin/env bash
# The sanitizer and fuzz steps of CI (.ci/run), with clang and without CUDA:
#   1. AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/): the unit suites (core, ops,
#      nn, data, optim, moe), dist_test at 1 rank and at 2 under mpirun, fsdp_test and
#      expert_parallel_test at 2 under mpirun;
#   2. ThreadSanitizer (build-tsan/): the communication-thread suites, core_test (CpuStream)
#      and dist_test at 1 rank and at 2 under mpirun; reports from inside the uninstrumented
#      OpenMP and MPI runtimes are suppressed (scripts/tsan.supp), ours are not;
#   3. each libFuzzer target in fuzz/ (safetensors, checkpoint metadata, llm.c shards,
#      tokenizer.json, the TCP store's messages over loopback, GGUF files) on its seed corpus in
#      fuzz/corpus/: a fixed seed and number of runs (repeatable), or FSDP_FUZZ_SECONDS each.
# Any sanitizer report, fuzz crash or failing test fails the script. It is a subset: the shell
# end-to-end tests (launchers, checkpoints, training) run in scripts/test.sh without sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FSDP_FUZZ_SECONDS:-0}
# Another clone of the same commit compiles from ccache (paths relative to the checkout; with -g
# the compile directory is not hashed either: only the debug info's paths differ).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
configure() {  # configure PRESET: CMakePresets.json's asan or tsan (clang, no CUDA), in build-PRESET
  local dir=build-$1
  [ -f "$dir/build.ninja" ] && return 0
  cmake --preset "$1" -B "$dir" > "build-sanitize-logs/$dir.configure.log" 2>&1 \
    || { cat "build-sanitize-logs/$dir.configure.log"; exit 1; }
}
fails=0
check() {  # check NAME command...: runs it, logs it, counts a failure
  local name=$1
  shift
  if "$@" > "sanitize-$name.log" 2>&1; then
    echo "sanitize: $name passed"
  else
    echo "sanitize: $name FAILED:"
    grep -m5 -E 'ERROR|WARNING: ThreadSanitizer|runtime error|FAILED|SUMMARY' "sanitize-$name.log" || tail -5 "sanitize-$name.log"
    fails=$((fails + 1))
  fi
}
mkdir -p build-sanitize-logs

# 1. ASan + UBSan, and the fuzz targets (libFuzzer needs the same build).
configure asan
fuzzers=(safetensors checkpoint shards tokenizer store gguf jinja)
cmake --build build-asan --target core_test ops_test nn_test data_test optim_test dist_test fsdp_test \
  moe_test expert_parallel_test \
  "${fuzzers[@]/#/fuzz_}" > build-sanitize-logs/build-asan.build.log 2>&1 || { tail -30 build-sanitize-logs/build-asan.build.log; exit 1; }
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
cd build-sanitize-logs
for t in core_test ops_test nn_test data_test optim_test dist_test moe_test; do check "asan-$t" ../build-asan/tests/$t; done
check asan-dist_test-np2 "${mpi[@]}" ../build-asan/tests/dist_test
check asan-fsdp_test-np2 "${mpi[@]}" ../build-asan/tests/fsdp_test
check asan-expert_parallel_test-np2 "${mpi[@]}" ../build-asan/tests/expert_parallel_test
# A fixed seed and a fixed number of runs per target (about 20 s each here), so CI is
# repeatable; FSDP_FUZZ_SECONDS > 0 fuzzes for that long instead, with a random seed.
declare -A runs=([safetensors]=60000 [checkpoint]=60000 [shards]=100000 [tokenizer]=10000 [store]=3000 [gguf]=60000
  [jinja]=20000)
for f in "${fuzzers[@]}"; do
  mkdir -p "corpus-$f"
  budget=(-seed=1 -runs="${runs[$f]}")
  [ "$secs" -gt 0 ] && budget=(-max_total_time="$secs")
  check "fuzz-$f" ../build-asan/fuzz/fuzz_$f "${budget[@]}" -max_len=4096 -timeout=10 \
    "corpus-$f" ../fuzz/corpus/$f
done
cd ..

# 2. TSan on the communication threads.
configure tsan
cmake --build build-tsan --target core_test dist_test > build-sanitize-logs/build-tsan.build.log 2>&1 \
  || { tail -30 build-sanitize-logs/build-tsan.build.log; exit 1; }
export TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/scripts/tsan.supp"
cd build-sanitize-logs
check tsan-core_test ../build-tsan/tests/core_test
check tsan-dist_test ../build-tsan/tests/dist_test
check tsan-dist_test-np2 "${mpi[@]}" ../build-tsan/tests/dist_test
cd ..
[ "$fails" -eq 0 ] || { echo "sanitize: $fails step(s) failed (logs in build-sanitize-logs/)"; exit 1; }
echo "sanitize: every step passed"
