#!/usr/bin/env bash
# fully_shard at one rank with bf16 parameters: the one-rank cast (the shard cast straight into
# bf16, the gradients added straight into it) against the collectives' path it replaced
# (FSDP_ONE_RANK_CAST=0: an all-gather and a reduce-scatter over a group of one, with their
# copies), side by side in one run, the tiny preset on this CPU. The losses must be equal; the
# ratio is the step time of the collectives' path over the cast's. Writes
# bench/results/one-rank-cast-cpu.md.
#   bench/one_rank_cast.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-12}
[ -n "${FSDP_BENCH_NO_BUILD:-}" ] || scripts/build.sh fsdp-train > /dev/null
out=${FSDP_BENCH_OUT:-bench/results/one-rank-cast-cpu.md}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
export OMP_WAIT_POLICY=PASSIVE
args=(--preset tiny --arch llama --vocab 256 --param-dtype bf16 --reduce-dtype f32 --steps "$steps"
  --data /usr/share/common-licenses/GPL-3 --sample-tokens 0)
for batch in 2 8; do
  for v in 0 1 0 1; do  # interleaved, twice: a busy moment does not favour one side
    FSDP_ONE_RANK_CAST=$v build/examples/fsdp-train "${args[@]}" --batch $batch \
      --log-file "$log/b$batch.$v.$RANDOM.jsonl" > /dev/null
  done
done
python3 - "$log" "$steps" > "$out" << 'PY'
import glob, json, os, statistics, sys, datetime
log, steps = sys.argv[1], int(sys.argv[2])
print(f"# One-rank cast vs the collectives' path, tiny llama, --param-dtype bf16, 1 rank, CPU "
      f"({datetime.date.today()}, {os.cpu_count()} cores)\n")
print("| batch | collectives (FSDP_ONE_RANK_CAST=0), ms | one-rank cast, ms | ratio | losses |")
print("| --- | --- | --- | --- | --- |")
for b in (2, 8):
    res = {}
    for v in ("0", "1"):
        runs = [[json.loads(l) for l in open(f)] for f in sorted(glob.glob(f"{log}/b{b}.{v}.*.jsonl"))]
        ms = [statistics.mean(r["step_ms"] for r in run[2:]) for run in runs]  # steps 2.. (warm)
        res[v] = (min(ms), [r["loss"] for r in runs[0]])
    same = "identical" if res["0"][1] == res["1"][1] else "DIFFER"
    print(f"| {b} x 256 | {res['0'][0]:.1f} | {res['1'][0]:.1f} | {res['0'][0] / res['1'][0]:.2f} | {same} over {steps} steps |")
print("\nStep: the best of 2 interleaved runs, each the mean of steps 2 and later.")
PY
cat "$out"
