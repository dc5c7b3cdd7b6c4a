#!/usr/bin/env bash
# Expert parallel against FSDP alone on one mixture of experts, side by side in one run on this CPU
# (issue 51): fsdp-train --init-from the bench-sized Qwen3-MoE of bench/moe_fsdp2.sh
# (bench/moe_model.sh: transformers' own random Qwen3MoeForCausalLM, 16 experts of hidden 512, top
# 2, in 3 of 4 blocks) at np 1 (the reference), np 2 (FSDP alone; EP 2) and np 4 (FSDP alone; EP 2
# x FSDP 2; EP 4), over gloo (scripts/fsdprun), one thread per rank, in alternating rounds (the
# layouts' order reversed every other round), on the same global batch (so every layout trains on
# the same rows and the losses must agree: the script fails past 1e-6 relative). Then each layout
# of 2 or more ranks once more, 2 steps with step 1 profiled (--profile-steps 1:2), for the
# all-to-all's calls, bytes and time: apart, as the profiler's start copies 2 x 256 MiB to measure
# the memory bandwidth, which would be in the timed runs' peak RSS. bench/moe_ep_report.py reads the runs and writes
# bench/results/moe-ep-cpu.md: ms/step, tokens/s and the ratio against FSDP alone at the same np
# (the better round of each, and each round's own), each rank's peak RSS (/usr/bin/time), the
# memory plan against the run, FSDP's all-gather bytes, the all-to-all's, and the losses side by side.
#   bench/moe_ep.sh [steps] [seq] [global batch]   # default 4 256 4 (1024 tokens/step), ROUNDS=2
#   bench/moe_ep.sh --tiny    # 2 steps of 4 x 16 tokens of a small model (8 experts), one round, stdout only
#   EXPERTS=8 MOE_HIDDEN=256 bench/moe_ep.sh ...   # another expert count (divisible by 4) or hidden size
# Needs the reference stack that writes the model: bench/setup_torch_ref.sh (FSDP_TORCH_PYTHON,
# default /opt/torchref/bin/python; transformers 4.51 or later for Qwen3-MoE).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=full
[ "${1:-}" = --tiny ] && { mode=tiny; shift; }
steps=${1:-4}
seq=${2:-256}
gbatch=${3:-4}
rounds=${ROUNDS:-2}
[ "$mode" = tiny ] && steps=2 seq=16 gbatch=4 rounds=1
[ "$steps" -ge 2 ] || { echo "moe_ep.sh: steps $steps; expected >= 2 (step 0 warms up)" >&2; exit 1; }
if [ "$gbatch" -le 0 ] || [ $((gbatch % 4)) != 0 ]; then
  echo "moe_ep.sh: global batch $gbatch; expected a positive multiple of 4 (np 1, 2 and 4 split it)" >&2
  exit 1
fi
# shellcheck source=bench/moe_model.sh
source bench/moe_model.sh
moe_model_args "$mode"
py=${FSDP_TORCH_PYTHON:-/opt/torchref/bin/python}
out=bench/results/moe-ep-cpu.md

moe_bench_setup moe_ep.sh "$seq" $((gbatch * seq * (steps + 1)))
layouts=("1 1" "2 1" "2 2" "4 1" "4 2" "4 4")  # np, expert parallel
train() {  # NAME NP EP STEPS [ARGS...]: one run, its output in $log/NAME.txt, its log NAME.jsonl
  local name=$1 np=$2 ep=$3 n=$4
  shift 4
  scripts/fsdprun --standalone --nproc_per_node "$np" "${maxrss[@]}" "$bin/fsdp-train" \
    --init-from "$log/model" --data "$log/data.bin" --steps "$n" --batch $((gbatch / np)) --seq "$seq" \
    --threads 1 --sample-tokens 0 --expert-parallel "$ep" --log-file "$log/$name.jsonl" "$@" \
    > "$log/$name.txt" 2>&1 || { cat "$log/$name.txt"; exit 1; }
}
# A step at np 1 first, discarded: the first run in a fresh FSDP_CACHE_DIR measures the sgemm peak
# (the MFU denominator), in its time and peak RSS; and the model's file is then in the page cache.
train warmup 1 1 1
for round in $(seq 1 "$rounds"); do
  order=("${layouts[@]}")
  [ $((round % 2)) = 0 ] && mapfile -t order < <(printf '%s\n' "${layouts[@]}" | tac)
  for layout in "${order[@]}"; do
    read -r np ep <<< "$layout"
    train "np${np}_ep${ep}_r$round" "$np" "$ep" "$steps"
  done
done
for layout in "${layouts[@]:1}"; do  # the profiled step of each layout of 2 or more ranks
  read -r np ep <<< "$layout"
  train "np${np}_ep${ep}_prof" "$np" "$ep" 2 --profile-steps 1:2 --profile-dir "$log/np${np}_ep${ep}_prof"
done

args=(--log "$log" --rounds "$rounds" --steps "$steps" --seq "$seq" --global-batch "$gbatch"
  --layouts "${layouts[*]// /x}" --load-start "$load0" --load-end "$(cut -d' ' -f1-3 /proc/loadavg)"
  --command "${EXPERTS:+EXPERTS=$EXPERTS }${MOE_HIDDEN:+MOE_HIDDEN=$MOE_HIDDEN }ROUNDS=$rounds bench/moe_ep.sh $steps $seq $gbatch"
  --commit "${FSDP_COMMIT:-$(git rev-parse --short HEAD 2> /dev/null || echo '?')}"
  --model "$(grep -oE 'Qwen3MoeForCausalLM, .*' "$log/make.txt") (bench/moe_fsdp2_ref.py --make ${model_args[*]})")
if [ "$mode" = tiny ]; then
  python3 bench/moe_ep_report.py "${args[@]}"
else
  status=0
  python3 bench/moe_ep_report.py "${args[@]}" > "$out" || status=$?
  sed -n '1,/^## Losses/p' "$out"
  exit $status
fi
