#!/usr/bin/env bash
# Activation checkpointing's cost and saving, side by side in one run: fsdp-train with
# --activation-checkpoint none, every:2 and full on the same model, steps and data, at 2 ranks.
# Per mode: the mean step time (the summary's, steps after the first), its ratio to none beside
# the ratio the FLOP count predicts (a recompute adds one forward, a third of a step's FLOPs:
# 4/3 for full, 1 + 1/3 x the checkpointed fraction for every:N) and the peak memory per rank.
#   bench/activation_checkpoint.sh [--dry-run] [FSDP-TRAIN FLAGS...]
# Writes bench/results/activation-checkpoint-cpu.md (--dry-run: one step of a tiny model, to
# check that the script runs; nothing written to bench/results).
set -euo pipefail
cd "$(dirname "$0")/.."
train=${FSDP_TRAIN:-build/examples/fsdp-train}
dry=0
if [ "${1:-}" = --dry-run ]; then
  dry=1
  shift
fi
[ -x "$train" ] || { echo "activation_checkpoint.sh: build first (scripts/build.sh): no $train" >&2; exit 1; }
if [ $dry = 1 ]; then
  args=(--preset tiny --dim 32 --layers 2 --heads 2 --seq 16 --batch 2 --steps 2)
  out=$(mktemp)
else
  args=(--preset tiny --arch llama --layers 12 --seq 256 --batch 8 --steps 8)
  out=bench/results/activation-checkpoint-cpu.md
fi
args+=("$@")
layers=$(printf '%s\n' "${args[@]}" | awk 'p {print; exit} $0 == "--layers" {p = 1}')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
export OMP_NUM_THREADS=1
# Two rounds, the modes alternating, so that all see the same machine noise; each mode's faster
# round is reported.
for round in 1 2; do
  for mode in none every:2 full; do
    "${mpi[@]}" "$train" "${args[@]}" --threads 1 --sample-tokens 0 --activation-checkpoint "$mode" \
      > "$work/$mode.$round.out" 2>&1 || { cat "$work/$mode.$round.out" >&2; exit 1; }
  done
done
step_ms() { sed -nE 's/^summary \| step ([0-9.]+) ms .*/\1/p' "$1"; }
for mode in none every:2 full; do
  best=1
  awk -v a="$(step_ms "$work/$mode.2.out")" -v b="$(step_ms "$work/$mode.1.out")" 'BEGIN {exit !(a < b)}' && best=2
  cp "$work/$mode.$best.out" "$work/$mode.out"
done
field() { sed -nE "s/^summary \\| step ([0-9.]+) ms \\| peak mem ([0-9.]+) MB.*/\\$2/p" "$work/$1.out"; }
{
  echo "# Activation checkpointing on CPU, 2 ranks"
  echo
  echo "$(date -u +%Y-%m-%d), $(lscpu | sed -nE 's/^Model name: +//p'), $(getconf _NPROCESSORS_ONLN) cores;"
  echo "\`fsdp-train ${args[*]} --threads 1\` under mpirun -np 2, per mode. Step time: the mean"
  echo "over the steps after the first, the faster of two alternating rounds. Predicted: one extra"
  echo "forward per checkpointed block."
  echo
  echo "| mode | step ms | ratio to none | FLOP-predicted ratio | peak mem / rank (MB) | peak vs none |"
  echo "|---|---|---|---|---|---|"
  base_ms=$(field none 1)
  base_mb=$(field none 2)
  for mode in none every:2 full; do
    ms=$(field "$mode" 1)
    mb=$(field "$mode" 2)
    case $mode in
      none) frac=0 ;;
      full) frac=1 ;;
      every:*) n=${mode#every:}; frac=$(awk -v l="$layers" -v n="$n" 'BEGIN {print int((l + n - 1) / n) / l}') ;;
    esac
    awk -v m="$mode" -v ms="$ms" -v b="$base_ms" -v f="$frac" -v mb="$mb" -v bmb="$base_mb" \
      'BEGIN {printf "| %s | %.1f | %.2f | %.2f | %.1f | %.2f |\n", m, ms, ms / b, 1 + f / 3, mb, mb / bmb}'
  done
} > "$out"
cat "$out"
[ $dry = 1 ] && rm -f "$out"
exit 0
