#!/usr/bin/env bash
# scripts/gpu_check.sh bounds its own time (issue 18): run here with stand-ins
# for every program it calls (tests/gpu_check_standin.sh: they print a line and
# sleep, longer in total than the budget allows; the seed run hangs), at a small
# budget, it must end within the budget plus a margin, and its summary.md must
# report every stage or name it as skipped, the hung one as timed out; and a
# TERM mid-run must leave the summary's closing lines.
#   gpu_check_test.sh GPU_CHECK_SH [BUDGET_S (40)]
# STANDIN_SLEEP and STANDIN_HANG (see the stand-in) may be set to try others;
# GPU_CHECK_STANDIN_DIR keeps the stand-ins (and the output) in that folder.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/testlib.sh
source "$here/testlib.sh"
script=${1:?usage: gpu_check_test.sh GPU_CHECK_SH [BUDGET_S]}
budget=${2:-40}
margin=8
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=${GPU_CHECK_STANDIN_DIR:-$tmp/standin}
mkdir -p "$dir/bin" "$dir/build/tests" "$dir/build/bench" "$dir/build/examples" \
  "$dir/build/CMakeFiles/fsdp.dir"
for p in bin/cmake bin/nvidia-smi bin/python3 bin/compute-sanitizer build/tests/cuda_test \
  build/tests/ops_test build/bench/fsdp-bench-gpu build/bench/fsdp-bench-kernels \
  build/examples/fsdp-train build/examples/fsdp-generate; do
  ln -sf "$here/gpu_check_standin.sh" "$dir/$p"
done
: > "$dir/build/CMakeFiles/fsdp.dir/standin.cu.o"
export STANDIN_SLEEP=${STANDIN_SLEEP:-2}
export STANDIN_HANG=${STANDIN_HANG-fsdp-train *--steps 20 --preset seed}
out=$dir/out
rm -rf "$out" "$out-term"

t0=$(date +%s.%N)
# The stand-ins first on PATH here too, so that a script that does not know
# FSDP_GPU_CHECK_STANDIN still runs them and not the real tools.
PATH="$dir/bin:$PATH" FSDP_GPU_CHECK_STANDIN=$dir FSDP_GPU_CHECK_BUDGET_S=$budget \
  FSDP_GPU_CHECK_EST_PCT=5 timeout -k 5 $((budget + 30)) bash "$script" "$out" > "$tmp/run.log" 2>&1
rc=$?
elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
echo "gpu_check.sh with stand-ins at a ${budget} s budget: exit $rc after ${elapsed} s"
s=$out/summary.md

awk -v e="$elapsed" -v l=$((budget + margin)) 'BEGIN {exit !(e <= l)}' && ok \
  || bad "ended after ${elapsed} s, past the ${budget} s budget + ${margin} s (exit $rc; 124: killed by this test)"
if [ -f "$s" ]; then
  ok
  stages=$(sed -n 's/^Stages, in order: \(.*\)\.$/\1/p' "$s")
  [ -n "$stages" ] && ok || bad "summary.md does not list its stages ('Stages, in order: ...')"
  for st in $stages; do
    if grep -qE "^## $st: (PASS|FAIL|DONE|TIMEOUT|SKIPPED)" "$s"; then
      ok
    elif grep -qE "^- not reached: .*\b$st\b" "$s"; then
      ok
    else
      bad "stage $st neither reported nor named as not reached"
    fi
  done
  grep -qE '^## End' "$s" && grep -qE '^Ended at [0-9]+ s of the [0-9]+ s budget' "$s" && ok \
    || bad "summary.md has no closing lines"
  grep -qE '^## build: PASS' "$s" && grep -qE '^## tests: PASS' "$s" && ok \
    || bad "the build and the tests (stand-ins) did not pass"
  if [ -n "$STANDIN_HANG" ]; then
    grep -qE '^## [a-z-]+: TIMEOUT' "$s" && grep -qE '^- timed out: .*fsdp-train.*: killed at' "$s" && ok \
      || bad "the hung fsdp-train is not reported as timed out"
    grep -qE '^## [a-z-]+: SKIPPED \(no time' "$s" && ok \
      || bad "no stage was skipped for time, though the hung stand-in runs past the budget"
  fi
else
  bad "no summary.md"
fi
[ $fails -eq 0 ] || { echo "--- output"; tail -40 "$tmp/run.log"; echo "--- summary.md"; cat "$s" 2> /dev/null; }

# TERM mid-run (the machine's own limit): the closing lines at once, the stages not reached named.
PATH="$dir/bin:$PATH" FSDP_GPU_CHECK_STANDIN=$dir FSDP_GPU_CHECK_BUDGET_S=100 FSDP_GPU_CHECK_EST_PCT=5 \
  bash "$script" "$out-term" > "$tmp/term.log" 2>&1 &
pid=$!
sleep 6
kill -TERM $pid
for _ in $(seq 100); do
  kill -0 $pid 2> /dev/null || break
  sleep 0.1
done
if kill -0 $pid 2> /dev/null; then
  bad "still running 10 s after TERM"
  kill -KILL $pid
fi
wait $pid
grep -qE '^Ended at [0-9]+ s of the 100 s budget: stopped by signal TERM' "$out-term/summary.md" 2> /dev/null \
  && grep -qE '^- not reached: [a-z]' "$out-term/summary.md" && ok \
  || { bad "after TERM, summary.md does not say so or name the stages not reached"; tail -5 "$tmp/term.log"; }
summary
