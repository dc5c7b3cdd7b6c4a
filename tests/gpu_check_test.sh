#!/usr/bin/env bash
# scripts/gpu_check.sh bounds its own time (issue 18): run here with stand-ins
# for every program it calls (tests/gpu_check_standin.sh: they print a line and
# sleep, longer in total than the budget allows; the seed run hangs), at a small
# budget, it must end within the budget plus a margin, and its summary.md must
# report every stage or name it as skipped, the hung one as timed out; OUT_DIR
# must hold what the device machine returns (at most 7 files, each under 16 MiB)
# and stdout must end with the summary; a build without NCCL stops the check;
# and a TERM mid-run must leave the summary's closing lines.
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
export STANDIN_HANG=${STANDIN_HANG-fsdp-train *--steps 20 --preset seed --profile-steps*}
out=$dir/out
rm -rf "$out" "$out-term" "$out-nccl" "$out-calls" "$out-broken"

t0=$(date +%s.%N)
# The stand-ins first on PATH here too, so that a script that does not know
# FSDP_GPU_CHECK_STANDIN still runs them and not the real tools.
PATH="$dir/bin:$PATH" FSDP_GPU_CHECK_STANDIN=$dir FSDP_GPU_CHECK_BUDGET_S=$budget \
  FSDP_GPU_CHECK_EST_PCT=5 FSDP_GPU_CHECK_WORK=$tmp/work timeout -k 5 $((budget + 30)) bash "$script" "$out" > "$tmp/run.log" 2>&1
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
  # What the call carried, in all, against its 64 MiB; cuDNN's versions, loaded and built against.
  grep -qE '^Carried: tree [0-9.]+ MiB .*= [0-9.]+ MiB of 64 MiB\.$' "$s" && ok \
    || bad "the summary does not give the carry's total: $(grep -E '^Carried' "$s")"
  grep -qE '^- cuDNN: cuDNN [0-9.]+ loaded, built against [0-9.]+$' "$s" && ok \
    || bad "the summary's end does not name cuDNN's versions: $(grep -E '^- cuDNN' "$s")"
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
# What comes back from the device machine: at most 8 files, 64 MiB in all. OUT_DIR holds
# summary.md and at most 6 others, each under 16 MiB; the work itself goes under /tmp.
n=$(find "$out" -type f 2> /dev/null | wc -l)
[ "$n" -le 7 ] && ok || bad "OUT_DIR holds $n files (at most 7 come back): $(cd "$out" 2> /dev/null && find . -type f | head -12 | tr '\n' ' ')"
big=$(find "$out" -type f -size +16M 2> /dev/null)
[ -z "$big" ] && ok || bad "files of 16 MiB or more in OUT_DIR: $big"
tar tzf "$out/logs.tar.gz" > "$tmp/tarball.txt" 2> /dev/null  # not piped to grep -q: no SIGPIPE under pipefail
grep -q 'cuda_test.log' "$tmp/tarball.txt" && ok \
  || bad "no log tarball holding cuda_test.log in OUT_DIR"
# The summary also ends stdout (if the files do not come back, the output's tail still does).
if [ -f "$s" ]; then
  tail -n "$(wc -l < "$s")" "$tmp/run.log" | cmp -s - "$s" && ok || bad "stdout does not end with summary.md"
fi
[ $fails -eq 0 ] || { echo "--- output"; tail -40 "$tmp/run.log"; echo "--- summary.md"; cat "$s" 2> /dev/null; }

# No NCCL in the build (PyTorch's wheel has libnccl.so.2 and no libnccl.so): --device cuda
# would only refuse, so the check stops at the build and names where CMake looked.
STANDIN_NO_SMI=1 STANDIN_NO_NCCL=1 PATH="$dir/bin:$PATH" FSDP_GPU_CHECK_STANDIN=$dir FSDP_GPU_CHECK_BUDGET_S=60 \
  FSDP_GPU_CHECK_EST_PCT=5 FSDP_GPU_CHECK_WORK=$tmp/work-nccl timeout -k 5 90 bash "$script" "$out-nccl" \
  > "$tmp/nccl.log" 2>&1
grep -qE '^## build: FAIL' "$out-nccl/summary.md" 2> /dev/null \
  && grep -qE 'no NCCL in this build.*searched /usr/local/cuda/include' "$out-nccl/summary.md" \
  && grep -qE '^## tests: SKIPPED \(no build' "$out-nccl/summary.md" && ok \
  || { bad "a build without NCCL is not refused with where CMake looked"; cat "$out-nccl/summary.md" 2> /dev/null | head -20; }
# (The same run had no nvidia-smi: the CUDA driver's query, which finds no driver here, decides.)
grep -qE '^GPU: .*nvidia-smi: .*\(no CUDA device\)\.$' "$out-nccl/summary.md" 2> /dev/null \
  && grep -qE '^- attention: no CUDA device$' "$out-nccl/summary.md" && ok \
  || bad "without nvidia-smi, the GPU is not looked for by a CUDA device query, or the attention row does not say no CUDA device: $(grep -E '^GPU|^- attention' "$out-nccl/summary.md" 2> /dev/null)"

# (These runs hang nowhere, so they end when their stages do; their budgets are wide, so that a
# loaded machine never skips a stage for time and the checks below never depend on its speed.)
# Who runs what, with no hang, from a tree built before the machine started (--prebuilt, a copy
# of the stand-in build elsewhere): no configure and no build there; the CPU-only ops_test not at
# all; the PyTorch reference without the CUDA tree's library path that our binaries get (it runs
# on its wheels' own libraries).
cp -a "$dir/build" "$tmp/prebuilt"
echo "-- fsdp: CUDA=ON cuDNN=ON NCCL=ON MPI=OFF Gloo=ON" > "$tmp/prebuilt/configure.log"
STANDIN_OPTABLE_FAILS=45 STANDIN_HANG='' STANDIN_SLEEP=1 STANDIN_CALLS=$tmp/calls.txt PATH="$dir/bin:$PATH" FSDP_GPU_CHECK_STANDIN=$dir \
  FSDP_GPU_CHECK_BUDGET_S=150 FSDP_GPU_CHECK_EST_PCT=5 FSDP_GPU_CHECK_WORK=$tmp/work-calls \
  timeout -k 5 170 bash "$script" --prebuilt "$tmp/prebuilt" "$out-calls" > "$tmp/calls.log" 2>&1
grep -qF -- "- prebuilt: $tmp/prebuilt, used as it is" "$out-calls/summary.md" 2> /dev/null \
  && ! grep -q '^cmake' "$tmp/calls.txt" && grep -q "^fsdp-train .*$tmp/prebuilt\|^cuda_test" "$tmp/calls.txt" && ok \
  || bad "--prebuilt: not used as it is, or cmake ran: $(grep -E 'prebuilt' "$out-calls/summary.md" 2> /dev/null)"
tail -n "$(wc -l < "$out-calls/summary.md")" "$tmp/calls.log" | cmp -s - "$out-calls/summary.md" \
  && [ "$(find "$out-calls" -type f | wc -l)" -le 7 ] && [ -z "$(find "$out-calls" -type f -size +16M)" ] && ok \
  || bad "--prebuilt: stdout does not end with the summary, or OUT_DIR holds too much"
# A prebuilt tree whose program needs a library this machine lacks (a real ELF linked against a
# shared library that is then removed, as OpenBLAS's libgfortran5 was missing once): named, and
# the check builds instead.
cp -a "$dir/build" "$tmp/broken"
mkdir -p "$tmp/fake"
echo 'int fake(void) { return 1; }' | gcc -shared -fPIC -x c - -o "$tmp/fake/libfsdpfake.so"
rm -f "$tmp/broken/examples/fsdp-train"
echo 'int fake(void); int main(void) { return fake(); }' \
  | gcc -x c - -o "$tmp/broken/examples/fsdp-train" -L"$tmp/fake" -lfsdpfake
rm -rf "$tmp/fake"
STANDIN_HANG='' STANDIN_SLEEP=1 STANDIN_CALLS=$tmp/calls-broken.txt PATH="$dir/bin:$PATH" FSDP_GPU_CHECK_STANDIN=$dir \
  FSDP_GPU_CHECK_BUDGET_S=150 FSDP_GPU_CHECK_EST_PCT=5 FSDP_GPU_CHECK_WORK=$tmp/work-broken \
  timeout -k 5 170 bash "$script" --prebuilt "$tmp/broken" "$out-broken" > "$tmp/broken.log" 2>&1
grep -qF -- "- prebuilt $tmp/broken not used: examples/fsdp-train needs libfsdpfake.so, not found here; built here instead" \
  "$out-broken/summary.md" 2> /dev/null && grep -qE '^## build: PASS' "$out-broken/summary.md" \
  && grep -q '^cmake --build' "$tmp/calls-broken.txt" && ok \
  || bad "a prebuilt tree that does not load is not named, or the check did not build: $(grep -E 'prebuilt|^## build' "$out-broken/summary.md" 2> /dev/null)"
grep -q '^cuda_test' "$tmp/calls.txt" 2> /dev/null && ! grep -q '^ops_test' "$tmp/calls.txt" && ok \
  || bad "ops_test (CPU-only) ran on the device, or cuda_test did not: $(cut -c1-60 "$tmp/calls.txt" 2> /dev/null | tr '\n' ';')"
grep -q 'torch_fsdp_ref.*LD_LIBRARY_PATH=<unset>$' "$tmp/calls.txt" 2> /dev/null && ok \
  || bad "the PyTorch reference did not run with its own library path: $(grep torch_fsdp_ref "$tmp/calls.txt" 2> /dev/null)"
grep -qF -- '- **attention, seed: cuDNN SDPA (cuDNN 9.19.0 loaded, built against 9.19.0)**' "$out-calls/summary.md" 2> /dev/null && ok \
  || bad "the seed stage does not name the attention path fsdp-train ran and cuDNN's versions: $(grep -E '^## seed' "$out-calls/summary.md")"
# cuda_test in separate commands, each with its own cap: the op table, then cuDNN's bf16
# comparisons, then the rest, then NCCL at one GPU with the shortcut off; f16 near the end.
order=$(grep -oE '^cuda_test --gtest_filter=[^ ]+' "$tmp/calls.txt" 2> /dev/null | sed 's/^cuda_test --gtest_filter=//' | paste -sd' ')
[ "$order" = "Build.* OpTable/* CudnnSdpa/*/bf16_* -OpTable/*:CudnnSdpa/*:Build.*:Nccl.MixedPrecision* Nccl.MixedPrecision* CudnnSdpa/*/f16_*" ] && ok \
  || bad "cuda_test's commands are not the op table, cuDNN bf16, the rest, NCCL, f16: $order"
grep -q -- '^fsdp-train .*--preset seed --profile-steps 17:20 ' "$tmp/calls.txt" && ok \
  || bad "the seed run does not profile its own steps 18-20"
# Every failure reaches the summary (no cut), and the totals: 45 failed op-table cases, 3 passed.
[ "$(grep -cE '^- FAILED OpTable/OpTableOnCuda.MatchesTheCpu/[0-9]+, where GetParam' "$out-calls/summary.md")" = 45 ] \
  && grep -qF -- '- FAILED OpTable/OpTableOnCuda.MatchesTheCpu/47, where GetParam() = 47' "$out-calls/summary.md" \
  && grep -qF 'stand-in case 47 output 0' "$out-calls/summary.md" \
  && grep -qF -- '- totals: 3 passed, 45 failed, 0 skipped (gtest: 48 ran)' "$out-calls/summary.md" \
  && grep -qE '^## optable: FAIL' "$out-calls/summary.md" && ok \
  || bad "the op table's failures or totals do not all reach the summary: $(grep -cE '^- FAILED' "$out-calls/summary.md") FAILED lines, $(grep -E '^- totals' "$out-calls/summary.md" | head -1)"

# TERM mid-run (the machine's own limit): the closing lines at once, the stages not reached named.
PATH="$dir/bin:$PATH" FSDP_GPU_CHECK_STANDIN=$dir FSDP_GPU_CHECK_BUDGET_S=100 FSDP_GPU_CHECK_EST_PCT=5 \
  FSDP_GPU_CHECK_WORK=$tmp/work-term bash "$script" "$out-term" > "$tmp/term.log" 2>&1 &
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
