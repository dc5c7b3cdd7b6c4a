#!/usr/bin/env bash
# A mixture of experts, side by side in one run on this CPU (issue 51): fsdp-train --init-from
# transformers' own random Qwen3MoeForCausalLM against PyTorch FSDP2 training the same folder
# (bench/moe_fsdp2_ref.py: fully_shard on every decoder layer and the root, output_router_logits,
# the load-balancing loss with the global batch's router statistics), both at 2 ranks over gloo
# (scripts/fsdprun, torchrun), one thread per rank, AdamW with fsdp-train's defaults, on the same
# windows of one shard of random tokens. Model (bench/moe_model.sh, bench-sized, so that the
# experts' GEMMs matter): vocab 8192, dim 512, 4 layers (layer 0 dense, ffn 1536; layers 1-3 MoE:
# 16 experts of hidden 512, top 2, norm_topk_prob), 8 heads / 4 KV heads of dim 64, QK-norm,
# untied, aux coef 0.02.
# Reports ms/step (mean over steps 1.., the first warms up; the better of alternating rounds),
# tokens/s and their ratio, each rank's peak RSS (ru_maxrss, /usr/bin/time, on both sides) and the
# losses side by side. Writes bench/results/moe-fsdp2-cpu.md.
#   bench/moe_fsdp2.sh [steps] [seq] [batch per rank]   # default 4 256 2, ROUNDS=2 alternating rounds
#   bench/moe_fsdp2.sh --tiny     # 2 steps of 1 x 16 tokens of a small model, one round, stdout only
#   EXPERTS=8 MOE_HIDDEN=256 bench/moe_fsdp2.sh ...   # another expert count or hidden size
# Needs the reference stack: bench/setup_torch_ref.sh (FSDP_TORCH_PYTHON, default
# /opt/torchref/bin/python; transformers 4.51 or later for Qwen3-MoE).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=full
[ "${1:-}" = --tiny ] && { mode=tiny; shift; }
steps=${1:-4}
seq=${2:-256}
batch=${3:-2}
rounds=${ROUNDS:-2}
[ "$mode" = tiny ] && steps=2 seq=16 batch=1 rounds=1
# shellcheck source=bench/moe_model.sh
source bench/moe_model.sh
moe_model_args "$mode"
np=2
py=${FSDP_TORCH_PYTHON:-/opt/torchref/bin/python}
out=bench/results/moe-fsdp2-cpu.md

moe_bench_setup moe_fsdp2.sh "$seq" $((np * batch * seq * (steps + 1)))
common=(--steps "$steps" --batch "$batch" --seq "$seq" --threads 1)
torch=("$(dirname "$py")/torchrun" --standalone --nproc_per_node "$np" --no-python "${maxrss[@]}"
  "$py" bench/moe_fsdp2_ref.py --train "$log/model" --data "$log/data.bin" "${common[@]}")
for round in $(seq 1 "$rounds"); do
  scripts/fsdprun --standalone --nproc_per_node "$np" "${maxrss[@]}" "$bin/fsdp-train" --init-from "$log/model" \
    --data "$log/data.bin" "${common[@]}" --sample-tokens 0 --log-file "$log/ours$round.jsonl" \
    > "$log/ours$round.txt" 2>&1 || { cat "$log/ours$round.txt"; exit 1; }
  "${torch[@]}" > "$log/torch$round.txt" 2>&1 || { cat "$log/torch$round.txt"; exit 1; }
done

# Per round: mean ms/step over steps 1.. (all of them when there is one step).
ours_ms() { awk -F'"step_ms":' 'NF > 1 {split($2, a, /[,}]/); ms[n++] = a[1]}
  END {s = 0; k = 0; for (i = (n > 1); i < n; i++) {s += ms[i]; k++} printf "%.1f", s / k}' "$1"; }
torch_ms() { grep -oE '\| step [0-9.]+ ms' "$1" | grep -oE '[0-9.]+' | tail -1; }
best_of() {  # $1: ms function, $2: prefix, $3: suffix; prints the best round
  local best=1 r m bm
  bm=$("$1" "$log/${2}1.$3")
  for r in $(seq 2 "$rounds"); do
    m=$("$1" "$log/$2$r.$3")
    if [ "$(awk -v a="$m" -v b="$bm" 'BEGIN {print (a < b)}')" = 1 ]; then best=$r bm=$m; fi
  done
  echo "$best"
}
ob=$(best_of ours_ms ours jsonl)
tb=$(best_of torch_ms torch txt)
ours_m=$(ours_ms "$log/ours$ob.jsonl")
torch_m=$(torch_ms "$log/torch$tb.txt")
tokens=$((np * batch * seq))
ours_tps=$(awk -v t="$tokens" -v m="$ours_m" 'BEGIN {printf "%.1f", t / m * 1000}')
torch_tps=$(awk -v t="$tokens" -v m="$torch_m" 'BEGIN {printf "%.1f", t / m * 1000}')
ratio=$(awk -v a="$torch_m" -v b="$ours_m" 'BEGIN {printf "%.2f", a / b}')
rss() {  # $1: output; each rank's maxrss in GB, by rank
  grep -oE 'rank [0-9]+ maxrss_kb [0-9]+' "$1" | sort -n -k2 | awk '{printf "%s%.2f", (NR > 1 ? " / " : ""), $4 / 1e6}'
}
# Each round's own ratio too: the two sides of a round ran minutes apart, so under a load that moves
# (a shared machine) the rounds' ratios say more than the best of each side.
rounds_s="" ratios=""
for r in $(seq 1 "$rounds"); do
  o=$(ours_ms "$log/ours$r.jsonl") t=$(torch_ms "$log/torch$r.txt")
  q=$(awk -v a="$t" -v b="$o" 'BEGIN {printf "%.2f", a / b}')
  rounds_s+="${rounds_s:+; }round $r: fsdp-train $o ms, PyTorch $t ms, ${q}x"
  ratios+="$q "
done
median=$(tr ' ' '\n' <<< "$ratios" | grep . | sort -g | awk '{v[NR] = $1} END {printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
losses_ours=$(awk -F'"loss":' 'NF > 1 {split($2, a, /[,}]/); printf "%s ", a[1]}' "$log/ours$ob.jsonl")
losses_torch=$(grep -oE 'torch-ref losses: .*' "$log/torch$tb.txt" | sed 's/torch-ref losses: //; s/[][,]/ /g')
versions=$(grep -oE 'torch [0-9][0-9.]* \| transformers [0-9.]+' "$log/torch$tb.txt" | sed 's/ |/,/')
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')

report() {
  echo "# CPU: a Qwen3-MoE, fsdp-train vs PyTorch FSDP2, $np ranks, f32"
  echo
  echo "Run: \`${EXPERTS:+EXPERTS=$EXPERTS }${MOE_HIDDEN:+MOE_HIDDEN=$MOE_HIDDEN }ROUNDS=$rounds bench/moe_fsdp2.sh $steps $seq $batch\` (fsdp.cpp ${FSDP_COMMIT:-$(git rev-parse --short HEAD 2> /dev/null || echo '?')}) on $(date -u +%Y-%m-%d), $cpu, $(getconf _NPROCESSORS_ONLN) cores,"
  echo "$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo) GiB; load average at the start $load0, at the end $(cut -d' ' -f1-3 /proc/loadavg): a machine"
  echo "shared with other engineers' builds and tests, so the times are noisy (compare the rounds)."
  echo "Model: $(grep -oE 'Qwen3MoeForCausalLM, .*' "$log/make.txt") (transformers' own random"
  echo "init, save_pretrained; bench/moe_fsdp2_ref.py --make ${model_args[*]})."
  echo "PyTorch: $versions (bench/setup_torch_ref.sh), bench/moe_fsdp2_ref.py: transformers' MoE block"
  echo "(a loop over the experts, index_add_), run over every expert so the ranks' reduce-scatters agree."
  echo "Both: $np ranks on one host (scripts/fsdprun / torchrun, Gloo), 1 thread per rank, fully_shard on every"
  echo "decoder layer and the root, AdamW lr 3e-4, wd 0.01, betas (0.9, 0.999), eps 1e-8, batch $batch x $seq per rank"
  echo "($tokens tokens/step) of random tokens, the same windows on both sides; the loss is the cross-entropy plus"
  echo "0.02 x the load-balancing loss over the global batch's router statistics."
  echo "ms/step: mean over steps 1..$((steps - 1)) (step 0 warms up), the better of $rounds alternating round(s)"
  echo "($rounds_s)."
  echo
  echo "| | ms/step | tok/s | peak RSS per rank (GB) |"
  echo "| --- | ---: | ---: | ---: |"
  echo "| fsdp-train | $ours_m | $ours_tps | $(rss "$log/ours$ob.txt") |"
  echo "| PyTorch FSDP2 | $torch_m | $torch_tps | $(rss "$log/torch$tb.txt") |"
  echo
  echo "**Speed-up: ${ratio}x** (PyTorch ms/step / fsdp-train ms/step, the better round of each; the median of the"
  echo "rounds' own ratios: ${median}x; issue 51's bar: 1.5x)."
  echo "Peak RSS is each rank's ru_maxrss (/usr/bin/time %M) over the whole process, loading included."
  echo
  echo "| step | fsdp-train loss | PyTorch loss | rel diff |"
  echo "| ---: | ---: | ---: | ---: |"
  paste <(tr ' ' '\n' <<< "$losses_ours" | grep .) <(tr ' ' '\n' <<< "$losses_torch" | grep .) \
    | awk '{printf "| %d | %.6f | %.6f | %.1e |\n", NR - 1, $1, $2, ($1 > $2 ? $1 - $2 : $2 - $1) / $2}'
  echo
  echo "## fsdp-train output (round $ob)"
  echo '```'
  grep -vE '^\[rank[0-9]+\]:\s*$' "$log/ours$ob.txt" || true
  echo '```'
  echo "## PyTorch output (round $tb)"
  echo '```'
  grep -vE 'Warning|warn\(|^\s*$' "$log/torch$tb.txt" || true
  echo '```'
}
if [ "$mode" = tiny ]; then
  report
else
  report > "$out"
  sed -n '1,/^| step /p' "$out"
  grep -E '^\| [0-9]+ \|' "$out"
fi
