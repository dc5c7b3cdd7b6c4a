#!/usr/bin/env bash
# fully_shard on this CPU: the tiny preset at world sizes 1, 2 and 4 (mpirun),
# global batch 8 x 256 tokens, for FSDP (reshard after forward), ZeRO-2 style
# (--reshard-after-forward false) and the DDP-style baseline (--shard none).
# Writes bench/results/fsdp-cpu.md: a memory table (persistent bytes per rank
# against the formula, peak bytes) and a time table (step time, time in
# collectives, and the part of it the compute thread had to wait for).
#   bench/fsdp_cpu.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8}
cores=$(nproc)
[ -n "${FSDP_BENCH_NO_BUILD:-}" ] || scripts/build.sh fsdp-train > /dev/null  # set: the build is done
bin=build/examples/fsdp-train
out=${FSDP_BENCH_OUT:-bench/results/fsdp-cpu.md}  # FSDP_BENCH_OUT: elsewhere (tests/bench_start_test.sh)
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
export OMP_WAIT_POLICY=PASSIVE

modes=("fsdp::" "zero2::--reshard-after-forward false" "ddp::--shard none")
for np in 1 2 4; do
  for m in "${modes[@]}"; do
    name=${m%%::*}
    flags=${m#*::}
    # shellcheck disable=SC2086
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np $np "$bin" --preset tiny --batch $((8 / np)) --steps "$steps" \
      $flags > "$log/$name-$np.txt" 2>&1
  done
done

field() { grep -oE "$2" "$1" | awk 'NR == 1' | grep -oE '[0-9.]+' | sed -n "${3:-1}p"; }
{
  echo "# fully_shard on this CPU: memory and time"
  echo
  echo "Run: \`bench/fsdp_cpu.sh $steps\` on $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $cores cores, Open MPI."
  echo "Model: tiny preset (seed architecture, 5.25 M parameters, f32), global batch 8 x 256 tokens split over the ranks."
  echo "Modes: **fsdp** = fully_shard on every block and the root; **zero2** = the same with"
  echo "\`--reshard-after-forward false\`; **ddp** = \`--shard none\` (replicated parameters, one all-reduce of all gradients)."
  echo
  echo "## Memory per rank"
  echo
  echo "Persistent = parameters + gradients + AdamW's two moments, as held between steps. The formula chunks"
  echo "each parameter's dim 0 over the ranks and pads to the largest chunk; \"measured\" is the allocator's"
  echo "count after building the model and optimizer. Peak is the allocator's high-water mark, largest rank."
  echo
  echo "| ranks | mode | persistent, formula (MB) | persistent, measured (MB) | peak (MB) |"
  echo "| ---: | --- | ---: | ---: | ---: |"
  for np in 1 2 4; do
    for m in "${modes[@]}"; do
      name=${m%%::*}
      f="$log/$name-$np.txt"
      echo "| $np | $name | $(field "$f" 'persistent mem / rank +\| [0-9.]+ MB formula, [0-9.]+' 1) | $(field "$f" 'persistent mem / rank +\| [0-9.]+ MB formula, [0-9.]+' 2) | $(field "$f" 'peak mem [0-9.]+ MB') |"
    done
  done
  echo
  echo "## Time per step"
  echo
  echo "Means over steps 1..$((steps - 1)). \"In collectives\" is time on the communication threads (all-gather and"
  echo "reduce-scatter groups for fsdp/zero2, the world group for ddp); \"exposed\" is the time the compute thread"
  echo "spent blocked waiting for them: the communication that compute did not hide."
  echo
  echo "| ranks | mode | step (ms) | tok/s | in collectives (ms) | exposed (ms) | exposed share |"
  echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"
  for np in 1 2 4; do
    for m in "${modes[@]}"; do
      name=${m%%::*}
      f="$log/$name-$np.txt"
      ms=$(field "$f" 'summary \| step [0-9.]+')
      toks=$(awk -v m="$ms" 'BEGIN {printf "%.0f", 2048 / m * 1000}')
      if grep -q 'ms/step in collectives' "$f"; then
        c=$(field "$f" '[0-9.]+ ms/step in')
        e=$(field "$f" '[0-9.]+ ms/step exposed')
        p=$(grep -oE '\([0-9]+%\)' "$f" | tr -d '()')
        echo "| $np | $name | $ms | $toks | $c | $e | $p |"
      else
        echo "| $np | $name | $ms | $toks | - | - | - |"
      fi
    done
  done
  echo
  echo "## Raw output (4 ranks, fsdp)"
  echo '```'
  grep -vE '^\+|^\|' "$log/fsdp-4.txt"
  echo '```'
} > "$out"
cat "$out"
