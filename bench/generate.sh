#!/usr/bin/env bash
# fsdp-generate on this CPU: the tiny llama (the preset: dim 256, 4 layers, vocab 4096,
# seq 256), a 64-token prompt, 192 new tokens, greedy, OMP threads = cores. Prefill and decode
# tokens/s with the KV cache, and decode without it (the window recomputed per token), beside
# the floors a decode step cannot beat: FLOPs (2 per parameter per token, at the sgemm rate
# fsdp-train measures in the same run) and bytes (the f32 weights read once per token, at the
# copy bandwidth numpy measures in the same run; the embedding's one row, not its table). Where llama.cpp's llama-bench is on PATH,
# the same model as GGUF runs beside it (-p 64 -n 192, same threads) and the ratio is printed.
# Writes bench/results/generate-cpu.md.
#   bench/generate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${FSDP_BENCH_NO_BUILD:-}" ] || scripts/build.sh fsdp-train fsdp-export fsdp-generate > /dev/null  # set: the build is done
bin=build/examples
out=${FSDP_BENCH_OUT:-bench/results/generate-cpu.md}  # FSDP_BENCH_OUT: elsewhere (tests/bench_start_test.sh)
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
threads=$(nproc)
export OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=PASSIVE
printf 'The license %.0s' {1..2000} > "$w/text.txt"
"$bin/fsdp-train" --preset tiny --arch llama --steps 2 --data "$w/text.txt" --sample-tokens 0 \
  --ckpt-dir "$w/ck" --ckpt-every 2 > "$w/train.txt" 2>&1
sgemm=$(grep -oE 'sgemm peak +\| [0-9.]+' "$w/train.txt" | grep -oE '[0-9.]+$')
"$bin/fsdp-export" --ckpt "$w/ck" --out "$w/m/model.safetensors" --gguf "$w/m.gguf" > /dev/null
prompt=$(head -c 64 /dev/zero | tr '\0' 'a')
run() { "$bin/fsdp-generate" --model "$w/m" --prompt "$prompt" --tokens 192 --temperature 0 --ignore-eos "$@" 2>&1 >/dev/null | tail -1; }
cached=$(run); cached=$(run)  # the second run: files in the page cache
plain=$(run --no-kv-cache)
params=$(python3 -c "import json; c=json.load(open('$w/m/config.json')); d,f,L,V=c['hidden_size'],c['intermediate_size'],c['num_hidden_layers'],c['vocab_size']; print(L*(4*d*d+3*d*f+2*d)+2*V*d+d)")
read_per_token=$(python3 -c "import json; c=json.load(open('$w/m/config.json')); print($params - (c['vocab_size'] - 1) * c['hidden_size'])")
gbps=$(python3 -c "
import numpy as np, time
a = np.ones(1 << 26, np.float32); b = np.empty_like(a); best = 1e9
for _ in range(5):
    t = time.perf_counter(); np.copyto(b, a); best = min(best, time.perf_counter() - t)
print(f'{2 * a.nbytes / best / 1e9:.1f}')")
num() { grep -oE "$1" <<< "$2" | grep -oE '[0-9.]+' | awk 'NR == 1'; }
prefill=$(num '\([0-9.]+ tokens/s\)' "$cached")
decode=$(num '[0-9.]+ tokens/s\)$' "$cached")
decode_plain=$(num '\([0-9.]+ tokens/s\)' "$plain")
flop_floor=$(python3 -c "print(f'{$sgemm * 1e9 / (2 * $params):.0f}')")
byte_floor=$(python3 -c "print(f'{$gbps * 1e9 / (4 * $read_per_token):.0f}')")
llama="llama-bench not on PATH: no llama.cpp figures in this run"
if command -v llama-bench > /dev/null; then
  llama=$(llama-bench -m "$w/m.gguf" -p 64 -n 192 -t "$threads" -o md 2>/dev/null || echo "llama-bench failed")
fi
{
  echo "# fsdp-generate on this CPU ($(date -u +%Y-%m-%d), $threads threads)"
  echo
  echo "Tiny llama preset: $params parameters (f32), vocab 4096, 4 layers, dim 256; a 64-token"
  echo "prompt, 192 new tokens, greedy. \`bench/generate.sh\` writes this file."
  echo
  echo "| | tokens/s | floor (tokens/s) |"
  echo "| --- | ---: | --- |"
  echo "| prefill, KV cache | $prefill | $flop_floor from FLOPs (2/param/token at $sgemm GFLOP/s sgemm) |"
  echo "| decode, KV cache | $decode | $byte_floor from bytes ($((4 * read_per_token / 1000)) kB/token at $gbps GB/s copy), $flop_floor from FLOPs |"
  echo "| decode, window recomputed | $decode_plain | |"
  echo
  echo "Decode reads every weight but the embedding table once per token: at"
  echo "$((4 * read_per_token / 1000000)) MB the tiny model can stay in the last-level cache, so the"
  echo "byte floor (DRAM bandwidth) can be beaten. Without the KV cache each token recomputes the"
  echo "whole window (up to 256 positions)."
  echo
  echo "llama.cpp, same GGUF, same threads:"
  echo
  echo "$llama"
} > "$out"
cat "$out"
