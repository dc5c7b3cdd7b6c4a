#!/usr/bin/env bash
# The fused, chunked head + cross-entropy (nn::ChunkedLMLoss, fsdp-train's default) on Gemma 3's
# vocabulary of 262,144 against a vocabulary of 4,096, on the same small llama (the tiny preset:
# 4 layers, dim 256) at seq 1024 x batch 4, one rank on this CPU, two AdamW steps each:
#   - what the measured peak (allocated) holds beyond the persistent state (parameters, gradients,
#     AdamW m and v, which grow with the embedding): 262,144 with the fused loss against 4,096;
#   - the same at 262,144 with --fused-loss false (the [4096 x 262144] f32 logits: 4.3 GB);
#   - the losses, fused against unfused (f32 rounding).
#   bench/big_vocab.sh [BUILD_DIR]   -> bench/results/big-vocab-cpu.md
set -euo pipefail
build=${1:-build}
train="$build/examples/fsdp-train"
[ -x "$train" ] || { echo "big_vocab: no $train; run scripts/build.sh" >&2; exit 1; }
out=bench/results/big-vocab-cpu.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() {  # vocab fused -> "peak_MB persistent_MB step_ms"
  local log="$work/$1_$2.txt"
  OMP_NUM_THREADS=$(nproc) "$train" --preset tiny --arch llama --vocab "$1" --seq 1024 --batch 4 --steps 2 \
    --fused-loss "$2" --sample-tokens 0 --seed 3 --log-file "$work/$1_$2.jsonl" > "$log" 2>&1
  local persistent peak step
  persistent=$(sed -n 's/.*persistent mem \/ rank *| *\([0-9.]*\) MB formula.*/\1/p' "$log")
  peak=$(sed -n 's/^summary .*| peak mem \([0-9.]*\) MB |.*/\1/p' "$log")
  step=$(sed -n 's/^summary | step \([0-9.]*\) ms.*/\1/p' "$log")
  echo "$peak $persistent $step"
}
read -r p4 s4 t4 < <(run 4096 true)
read -r pf sf tf < <(run 262144 true)
read -r pu su tu < <(run 262144 false)
losses=$(python3 - "$work" << 'PY'
import json, sys
w = sys.argv[1]
f = [json.loads(l)["loss"] for l in open(f"{w}/262144_true.jsonl")]
u = [json.loads(l)["loss"] for l in open(f"{w}/262144_false.jsonl")]
print(" ".join(f"{a!r}/{b!r} ({abs(a - b) / abs(b):.1e})" for a, b in zip(f, u)))
PY
)
{
  echo "# The fused, chunked head + loss on a 262,144-token vocabulary (CPU, one rank)"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores, \`bench/big_vocab.sh\`: fsdp-train --preset tiny --arch llama"
  echo "(4 layers, dim 256), seq 1024 x batch 4 (4,096 rows), two AdamW steps, f32."
  echo "Transient = the measured peak of allocated memory less the persistent state (parameters,"
  echo "gradients, AdamW m and v), which grows with the embedding and the head."
  echo
  echo "| vocabulary | loss | peak allocated | persistent | transient | step |"
  echo "|---|---|---|---|---|---|"
  echo "| 4,096 | fused (one chunk: the logits kept) | $p4 MB | $s4 MB | $(python3 -c "print(round($p4 - $s4, 1))") MB | $t4 ms |"
  echo "| 262,144 | fused, 128 rows a chunk | $pf MB | $sf MB | $(python3 -c "print(round($pf - $sf, 1))") MB | $tf ms |"
  echo "| 262,144 | --fused-loss false | $pu MB | $su MB | $(python3 -c "print(round($pu - $su, 1))") MB | $tu ms |"
  echo
  echo "Transient, 262,144 fused less 4,096: $(python3 -c "print(round(($pf - $sf) - ($p4 - $s4), 1))") MB (the issue's bound: 300 MB)."
  echo "Losses, fused / unfused (relative difference): $losses"
} > "$out"
cat "$out"
