#!/usr/bin/env bash
# Side by side on this CPU, in one run, with the same threads: fsdp-train and
# the same model in PyTorch (bench/minillm_torch.py) on the tiny preset of the
# reference (seed) architecture, random tokens, f32; plus the OpenBLAS sgemm
# peak measured afresh. Writes bench/results/cpu-tiny.md.
#   bench/cpu_vs_torch.sh [threads] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
steps=${2:-12}
py=${PYTHON:-/usr/bin/python3}
[ -n "${FSDP_BENCH_NO_BUILD:-}" ] || scripts/build.sh fsdp-train > /dev/null  # set: the build is done
out=${FSDP_BENCH_OUT:-bench/results/cpu-tiny.md}  # FSDP_BENCH_OUT: elsewhere (tests/bench_start_test.sh)
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# Two rounds, alternating, so that both see the same machine noise; each
# side's better round is reported. A fresh cache directory makes fsdp-train
# measure the sgemm peak in this run.
for round in 1 2; do
  FSDP_CACHE_DIR="$log/cache" build/examples/fsdp-train --preset tiny --steps "$steps" --threads "$threads" \
    > "$log/ours$round.txt"
  "$py" bench/minillm_torch.py --steps "$steps" --threads "$threads" > "$log/torch$round.txt"
done
# Mean ms/step over steps 2.. (the first two warm up), from the per-step tok/s.
ours_mean() { grep -E '^step ' "$1" | awk -v t=2048 'NR > 2 {s += t / $7 * 1000; n++} END {printf "%.1f", s / n}'; }
torch_mean() { grep -oE 'ms/step [0-9.]+' "$1" | grep -oE '[0-9.]+$'; }
best=1; [ "$(awk -v a="$(ours_mean "$log/ours2.txt")" -v b="$(ours_mean "$log/ours1.txt")" 'BEGIN {print (a < b)}')" = 1 ] && best=2
cp "$log/ours$best.txt" "$log/ours.txt"
best=1; [ "$(awk -v a="$(torch_mean "$log/torch2.txt")" -v b="$(torch_mean "$log/torch1.txt")" 'BEGIN {print (a < b)}')" = 1 ] && best=2
cp "$log/torch$best.txt" "$log/torch.txt"
rounds="fsdp-train $(ours_mean "$log/ours1.txt") / $(ours_mean "$log/ours2.txt") ms, PyTorch $(torch_mean "$log/torch1.txt") / $(torch_mean "$log/torch2.txt") ms"

peak=$(grep -oE 'sgemm peak +\| [0-9.]+' "$log/ours.txt" | grep -oE '[0-9.]+$')
flops=$(grep -oE 'FLOPs / token +\| [0-9.e+]+' "$log/ours.txt" | grep -oE '[0-9.e+]+$')
ours_ms=$(ours_mean "$log/ours.txt")
torch_ms=$(torch_mean "$log/torch.txt")
torch_ver=$(grep -m1 -oE 'torch [0-9][^,]*' "$log/torch.txt" || true)
ratio=$(awk -v a="$torch_ms" -v b="$ours_ms" 'BEGIN {printf "%.2f", a / b}')
# One peak for both rows: the measured one, raised by fsdp-train's own steps (its summary's "peak |
# raised from A to B" line) and by PyTorch's rate, so that no row reads more than 100%.
raised=$(grep -oE '^peak \| raised from [0-9.]+ to [0-9.]+' "$log/ours.txt" | grep -oE '[0-9.]+$' || true)
[ -n "$raised" ] && peak=$raised
torch_gflops=$(awk -v m="$torch_ms" -v f="$flops" 'BEGIN {printf "%.1f", f * 2048 / (m / 1000) / 1e9}')
peak_note="Measured sgemm peak: $peak GFLOP/s."
[ -z "$raised" ] || peak_note="Measured sgemm peak, raised by the rate of fsdp-train's own steps: $peak GFLOP/s."
if awk -v t="$torch_gflops" -v p="$peak" 'BEGIN {exit !(t > p)}'; then
  peak_note="$peak_note PyTorch's steps ran at $torch_gflops GFLOP/s, above it: the MFU column is against $torch_gflops (PyTorch's BLAS outran the sgemm measured here: look at the OpenBLAS core above, or at a loaded machine)."
  peak=$torch_gflops
fi
mfu() { awk -v m="$1" -v p="$peak" -v f="$flops" 'BEGIN {printf "%.1f", f * 2048 / (m / 1000) / (p * 1e9) * 100}'; }
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')
cpu="$cpu (family $(grep -m1 '^cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' '))"
# The kernel OpenBLAS picked for this CPU: an OpenBLAS older than the CPU falls back to a generic
# one (Debian 12's 0.3.21 picks Prescott, SSE3, on an Emerald Rapids Xeon: 3x slower there).
# OpenBLAS names its kernels as it loads: twice when fsdp-train re-executed with better ones.
cores=$(OPENBLAS_VERBOSE=2 build/examples/fsdp-train --help 2>&1 | sed -n 's/^Core: //p')
core=$(echo "$cores" | tail -1)
chose=$(echo "$cores" | head -1)
core="OpenBLAS core ${core:-unknown}${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}"
[ "$chose" != "$(echo "$cores" | tail -1)" ] && core="$core (fsdp-train re-executed with it; OpenBLAS chose $chose)"
# The library the build chose (cmake/blas.cmake) and its kernels, from fsdp-train's table.
blas=$(FSDP_GEMM_PEAK_GFLOPS=1 build/examples/fsdp-train --preset tiny --dim 64 --layers 1 --heads 2 \
  --seq 32 --batch 1 --steps 1 2>&1 | sed -nE 's/^\| blas (library|kernels) +\| (.*[^ ]) +\|$/\2/p' | paste -sd' ')
case $blas in openblas*) core="BLAS $blas; $core" ;; *) core="BLAS ${blas:-unknown}" ;; esac

{
  echo "# CPU: fsdp-train vs PyTorch, tiny preset (seed architecture), f32"
  echo
  echo "Run: \`bench/cpu_vs_torch.sh $threads $steps\` on $(date -u +%Y-%m-%d), $cpu, $threads threads, $core."
  echo "Model: vocab 4096, dim 256, 4 layers, 4 heads, seq 256, batch 8 (2048 tokens/step), random tokens, AdamW."
  echo "Times are the mean of steps 2..$((steps - 1)) (the first two warm up); two alternating rounds each,"
  echo "the better one reported (rounds: $rounds)."
  echo
  echo "| | ms/step | tok/s | MFU vs measured sgemm peak |"
  echo "| --- | ---: | ---: | ---: |"
  echo "| fsdp-train | $ours_ms | $(awk -v m="$ours_ms" 'BEGIN {printf "%.0f", 2048 / m * 1000}') | $(mfu "$ours_ms")% |"
  echo "| PyTorch ($torch_ver) | $torch_ms | $(awk -v m="$torch_ms" 'BEGIN {printf "%.0f", 2048 / m * 1000}') | $(mfu "$torch_ms")% |"
  echo
  echo "**Speed-up: ${ratio}x** (PyTorch ms/step / fsdp-train ms/step). $peak_note"
  echo
  if command -v perf > /dev/null && perf record -q -o "$log/perf.data" -- build/examples/fsdp-train --preset tiny \
      --steps 6 --threads "$threads" > /dev/null 2>&1; then
    echo "## Where fsdp-train's time goes"
    echo
    echo "\`perf record\` over 6 steps of the same run, share of CPU samples by symbol:"
    echo '```'
    # awk reads all of perf's output: a reader that stops early (head) would kill perf with
    # SIGPIPE, and pipefail would end the script with 141 and a truncated results file.
    perf report -i "$log/perf.data" --no-children --sort symbol 2> /dev/null | awk '/^ +[0-9]/ && n++ < 14'
    echo '```'
    echo "OpenBLAS's sgemm (kernel, packing copies and beta scaling) is most of the step, and PyTorch's step is"
    echo "GEMM-bound too, so the ratio is bounded by how much closer to the sgemm peak each side gets."
    echo
  fi
  echo "## fsdp-train output"
  echo '```'
  cat "$log/ours.txt"
  echo '```'
  echo "## PyTorch output"
  echo '```'
  cat "$log/torch.txt"
  echo '```'
} > "$out"
head -n 14 "$out"
