#!/usr/bin/env bash
# What a checkpoint costs the training loop, synchronous against --async-checkpoint: the same
# fsdp-train run at 2 ranks, saving every 2 steps, once each way (two rounds, alternating). Per
# save: the seconds training was held (sync: the whole save, "checkpoint: done in"; async: the
# host copy and any wait for the write before, "training blocked"), and the run's mean step time
# (the background writer shares the cores). The checkpoints go to a folder on disk (fsynced).
#   bench/async_checkpoint.sh [--dry-run] [FSDP-TRAIN FLAGS...]
# Writes bench/results/async-checkpoint-cpu.md (--dry-run: a tiny model, to check that the script
# runs; nothing written to bench/results).
set -euo pipefail
cd "$(dirname "$0")/.."
train=${FSDP_TRAIN:-build/examples/fsdp-train}
dry=0
if [ "${1:-}" = --dry-run ]; then
  dry=1
  shift
fi
[ -x "$train" ] || { echo "async_checkpoint.sh: build first (scripts/build.sh): no $train" >&2; exit 1; }
if [ $dry = 1 ]; then
  args=(--preset tiny --dim 32 --layers 2 --heads 2 --seq 16 --batch 2 --steps 4)
  out=$(mktemp)
else
  # 35.7 M parameters: 409 MB per checkpoint (parameters and AdamW's two moments, f32)
  args=(--preset tiny --arch llama --vocab 8192 --dim 512 --layers 8 --heads 8 --seq 64 --batch 2 --steps 8)
  out=bench/results/async-checkpoint-cpu.md
fi
args+=("$@")
work=$(mktemp -d "${TMPDIR:-/var/tmp}/async_ckpt_bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
cat /usr/share/common-licenses/* > "$work/text.txt" 2> /dev/null
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
load0=$(cut -d" " -f1-3 /proc/loadavg)
export OMP_NUM_THREADS=1
for round in 1 2; do
  for mode in sync async; do
    flag=()
    [ $mode = async ] && flag=(--async-checkpoint)
    rm -rf "$work/ck"
    t0=$(date +%s.%N)
    "${mpi[@]}" "$train" "${args[@]}" --threads 1 --sample-tokens 0 --data "$work/text.txt" \
      --ckpt-dir "$work/ck" --ckpt-every 2 "${flag[@]}" > "$work/$mode.$round.out" 2>&1 \
      || { cat "$work/$mode.$round.out" >&2; exit 1; }
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}' > "$work/$mode.$round.wall"
  done
done
blocked() {  # the seconds each save held training, one a line
  sed -nE -e 's/^checkpoint: done in ([0-9.]+) s$/\1/p' \
    -e 's/^checkpoint: step [0-9]+ copied in .* \(training blocked ([0-9.]+) s\).*/\1/p' "$1"
}
step_ms() { sed -nE 's/^summary \| step ([0-9.]+) ms .*/\1/p' "$1"; }
mean() { awk '{s += $1; n++} END {printf "%.3f", n ? s / n : 0}'; }
size=$(du -sm "$work/ck/step_00000002" | cut -f1)
{
  echo "# Asynchronous checkpoints on CPU, 2 ranks"
  echo
  echo "$(date -u +%Y-%m-%d), $(lscpu | sed -nE 's/^Model name: +//p'), $(getconf _NPROCESSORS_ONLN) cores,"
  echo "checkpoints on $(df -T "$work" | awk 'NR == 2 {print $2}') ($size MB each); load average $load0 before,"
  echo "$(cut -d" " -f1-3 /proc/loadavg) after (the machine is shared: other work runs beside it)."
  echo "\`fsdp-train ${args[*]} --threads 1 --ckpt-every 2\` under mpirun -np 2, without and with"
  echo "\`--async-checkpoint\`, two alternating rounds. Blocking: the seconds each save held the"
  echo "training loop (sync: the whole save; async: the host copy, and the wait for the write"
  echo "before when it had not finished). Step: the summary's mean step time (steps after the first;"
  echo "the background writer shares the cores with training). Run: the whole mpirun, wall seconds."
  echo
  echo "| mode | round | blocking s per save | mean blocking s | mean step ms | run s |"
  echo "|---|---|---|---|---|---|"
  for round in 1 2; do
    for mode in sync async; do
      f="$work/$mode.$round.out"
      echo "| $mode | $round | $(blocked "$f" | tr '\n' ' ' | sed 's/ $//') | $(blocked "$f" | mean) | $(step_ms "$f") | $(cat "$work/$mode.$round.wall") |"
    done
  done
  echo
  s=$(cat "$work"/sync.*.out | blocked /dev/stdin | mean)
  a=$(cat "$work"/async.*.out | blocked /dev/stdin | mean)
  awk -v s="$s" -v a="$a" 'BEGIN {printf "Mean blocking per save, both rounds: sync %.3f s, async %.3f s: %.0fx less.\n", s, a, (a > 0 ? s / a : 0)}'
} > "$out"
cat "$out"
[ $dry = 1 ] && rm -f "$out"
exit 0
