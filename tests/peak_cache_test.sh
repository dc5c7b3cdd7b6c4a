#!/usr/bin/env bash
# The GEMM peak's cache (profiler/ceilings.h) under fsdp-train and profile_linear,
# on any machine at any load (no rate is asserted, only how the peak moves):
#   1. a low cached peak (1 MFLOP/s, as a measurement on a busy machine leaves)
#      is raised by the rates the run observes, every MFU and %peakFL stays at
#      or below 100%, the summary says so and the cache file is rewritten (its
#      other entries kept);
#   2. a high cached peak is not lowered by a run, but FSDP_GEMM_PEAK_REMEASURE=1
#      measures again and replaces it; a bad value of the knob is refused;
#   3. a cache file that is not JSON is named on stderr, measured again and
#      rewritten.
#   peak_cache_test.sh EXAMPLES_DIR   (holding fsdp-train and profile_linear)
set -uo pipefail
dir=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"
export FSDP_CACHE_DIR=$work/cache OMP_WAIT_POLICY=PASSIVE
unset FSDP_GEMM_PEAK_GFLOPS FSDP_GEMM_PEAK_REMEASURE
cache=$FSDP_CACHE_DIR/sgemm_peak.json
mkdir -p "$FSDP_CACHE_DIR"
model=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: //')
[ -n "$model" ] || model=unknown
cpus=$(getconf _NPROCESSORS_ONLN)
small=(--preset tiny --vocab 256 --dim 64 --layers 2 --heads 2 --seq 64 --batch 4 --threads 2)
# The key names the BLAS's kernels too: those fsdp-train runs (after choosing better ones,
# ops/blas.h), from its table's rows (a forced peak: the cache is not touched), and the library
# where it is not Debian's OpenBLAS ("blis zen3").
FSDP_GEMM_PEAK_GFLOPS=1 "$dir/fsdp-train" "${small[@]}" --steps 1 > "$work/blas.out" 2>&1
kernel=$(sed -nE 's/^\| blas kernels +\| ([^ (]+).*\|$/\1/p' "$work/blas.out")
library=$(sed -nE 's/^\| blas library +\| ([^ ]+) .*\|$/\1/p' "$work/blas.out")
[ -n "$kernel" ] && [ -n "$library" ] || { echo "FAIL: no blas rows in fsdp-train's table: $(tail -3 "$work/blas.out")"; exit 1; }
[ "$library" = openblas ] || kernel="$library $kernel"

# Writes the cache with every thread count of this CPU at $1 FLOP/s, and one other CPU's entry.
seed() {
  python3 - "$cache" "$model" "$cpus" "$1" "$kernel" << 'EOF'
import json, sys
path, model, cpus, v, kernel = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
c = {f"{model} x{t} {kernel}": v for t in range(1, max(cpus, 2) + 1)}
c["another cpu x64"] = 5e9
json.dump(c, open(path, "w"))
EOF
}
# The cached peak of this CPU with all its cores (fsdp-train's key).
cached() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$cache" "$model x$cpus $kernel"; }
# The largest MFU of the step lines, and the largest %peakFL of a key-averages table.
max_mfu() { grep -E '^step [0-9]+ \|' "$1" | sed -E 's/.*\| mfu ([0-9.]+)% \|.*/\1/' | sort -g | tail -1; }
max_peakfl() {
  python3 - "$1" << 'EOF'
import sys
head = None
best = 0.0
for line in open(sys.argv[1]):
    if "%peakFL" in line:
        head = line.index("%peakFL")
        continue
    if head is None or line.startswith("-") or len(line) < head + 7:
        continue
    try:
        best = max(best, float(line[head - 1 : head + 7]))
    except ValueError:
        pass
print(best)
EOF
}

# 1. A low cached peak, raised by fsdp-train's steps and by its profile window.
seed 1e6
if "$dir/fsdp-train" "${small[@]}" --steps 4 --profile-steps 2:3 --profile-dir "$work/prof" \
  > "$work/low.out" 2> "$work/low.err"; then
  m=$(max_mfu "$work/low.out")
  awk -v m="$m" 'BEGIN {exit !(m != "" && m <= 100.0)}' && ok || bad "an MFU above 100% (or none): $m"
  grep -qE "^peak \| raised from 0\.0 to [0-9.]+ GFLOP/s \(all ranks\) by a step's observed rate, cached in $cache" \
    "$work/low.out" && ok || bad "the summary does not say the peak was raised: $(tail -3 "$work/low.out")"
  awk -v v="$(cached)" 'BEGIN {exit !(v > 1e6)}' && ok || bad "the cache was not raised: $(cat "$cache")"
  grep -q '"another cpu x64": 5000000000' "$cache" && ok || bad "the cache lost another entry: $(cat "$cache")"
  p=$(max_peakfl "$work/prof/table_rank0.txt")
  awk -v p="$p" 'BEGIN {exit !(p > 0 && p <= 100.0)}' && ok || bad "a %peakFL above 100% (or none): $p"
else
  bad "fsdp-train with a low cached peak failed: $(tail -5 "$work/low.err")"
fi
seed 1e6
if "$dir/profile_linear" --features 128 --rows 64 --out "$work/linear.json" > "$work/linear.out" 2>&1; then
  p=$(max_peakfl "$work/linear.out")
  awk -v p="$p" 'BEGIN {exit !(p > 0 && p <= 100.0)}' && ok || bad "profile_linear: a %peakFL above 100% (or none): $p"
  grep -qE "^peak \| cpu f32: '[a-z_]+' ran at [0-9.]+ GFLOP/s, above the GEMM peak of 0\.0 GFLOP/s; the peak is raised to it" \
    "$work/linear.out" && ok || bad "profile_linear does not say the peak was raised: $(cat "$work/linear.out")"
else
  bad "profile_linear failed: $(cat "$work/linear.out")"
fi

# 2. A high cached peak stays (nothing observed lowers it) until a refresh is asked for.
seed 1e15
"$dir/fsdp-train" "${small[@]}" --steps 2 > "$work/high.out" 2>&1 \
  && awk -v v="$(cached)" 'BEGIN {exit !(v >= 1e15)}' && ! grep -q '^peak |' "$work/high.out" && ok \
  || bad "a high cached peak moved or the run failed: $(cached); $(tail -3 "$work/high.out")"
FSDP_GEMM_PEAK_REMEASURE=1 "$dir/fsdp-train" "${small[@]}" --steps 1 > "$work/re.out" 2>&1 \
  && awk -v v="$(cached)" 'BEGIN {exit !(v > 0 && v < 1e15)}' && ok \
  || bad "FSDP_GEMM_PEAK_REMEASURE=1 did not replace the cached peak: $(cached); $(tail -3 "$work/re.out")"
FSDP_GEMM_PEAK_REMEASURE=2 "$dir/fsdp-train" "${small[@]}" --steps 1 > "$work/knob.out" 2>&1 \
  && bad "FSDP_GEMM_PEAK_REMEASURE=2 was accepted" \
  || { grep -q "FSDP_GEMM_PEAK_REMEASURE='2' is not valid" "$work/knob.out" && ok \
    || bad "FSDP_GEMM_PEAK_REMEASURE=2: $(cat "$work/knob.out")"; }

# 3. A cache that is not JSON: named, measured again, rewritten.
printf 'garbage {' > "$cache"
if "$dir/fsdp-train" "${small[@]}" --steps 1 > "$work/bad.out" 2> "$work/bad.err"; then
  grep -qF "[ceilings] the peak cache '$cache' is not a JSON object of FLOP/s" "$work/bad.err" \
    && grep -q "measuring again" "$work/bad.err" && ok || bad "the bad cache was not named: $(cat "$work/bad.err")"
  awk -v v="$(cached)" 'BEGIN {exit !(v > 0)}' && ok || bad "the cache was not rewritten: $(cat "$cache")"
else
  bad "fsdp-train with a bad cache failed: $(tail -5 "$work/bad.err")"
fi
summary
