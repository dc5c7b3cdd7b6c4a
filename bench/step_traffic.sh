#!/usr/bin/env bash
# The step's memory traffic (issue 54), before against after in one run, on this CPU: fsdp-train
# built from the commit before the change (FSDP_BENCH_BASE, default 5868212; its sources exported
# with git archive into build/traffic-base/, built there with the same preset and flags, from
# ccache) against this checkout's. After: the step's first gradient written into the sharded
# gradients (no zeroing pass, no add to zeros; the reduce-scatter writes them and its input is
# not zero-filled but for its padding; at one rank with the master's reduce dtype the layers add
# straight into the shard's gradients), clipping's factor applied inside AdamW's pass (the
# gradients read once by the norm and once by AdamW, never rewritten) and AdamW over every tensor
# in one OpenMP region. The tiny llama with --grad-clip 1 (the clipping acts at every step), at
# one rank in f32, one rank with bf16 parameters, and two ranks (Gloo) with two microbatches.
# The losses and grad norms must be equal bit for bit; the ratio is before's step time over
# after's. A profiled run of each at one rank adds the time per step of the ops the change
# touches, and fsdp-bench-traffic (bench/step_traffic.cpp) times the step's tail (the gradient's
# arrival, the clipping and AdamW) before and after in one process, where the step's GEMMs do not
# drown it. Writes bench/results/step-traffic-cpu.md.
#   bench/step_traffic.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-10}
base=${FSDP_BENCH_BASE:-5868212}
[ -n "${FSDP_BENCH_NO_BUILD:-}" ] || scripts/build.sh fsdp-train fsdp-bench-traffic > /dev/null
src=build/traffic-base/$(git rev-parse --short "$base")
if [ ! -x "$src/build/examples/fsdp-train" ]; then
  rm -rf "$src" && mkdir -p "$src/build"
  git archive "$base" | tar -x -C "$src"
  ln -sfn "$PWD/build/_deps" "$src/build/_deps"  # cudnn-frontend's headers, as install-deps put them
  (cd "$src" && CCACHE_BASEDIR=$PWD scripts/build.sh fsdp-train > /dev/null)
fi
before=$src/build/examples/fsdp-train
after=build/examples/fsdp-train
out=${FSDP_BENCH_OUT:-bench/results/step-traffic-cpu.md}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
export OMP_WAIT_POLICY=PASSIVE
args=(--preset tiny --arch llama --vocab 256 --steps "$steps" --grad-clip 1.0
  --data /usr/share/common-licenses/GPL-3 --sample-tokens 0)
configs=("f32::--batch 8" "bf16::--batch 8 --param-dtype bf16 --reduce-dtype f32"
  "np2::--batch 4 --grad-accum 2")
for c in "${configs[@]}"; do
  name=${c%%::*}
  read -r -a extra <<< "${c#*::}"
  for side in before after before after before after; do  # interleaved: a busy moment favours neither
    bin=$before
    [ "$side" = after ] && bin=$after
    if [ "$name" = np2 ]; then
      OMP_NUM_THREADS=1 scripts/fsdprun --nproc_per_node 2 "$bin" "${args[@]}" "${extra[@]}" \
        --log-file "$log/$name.$side.$RANDOM.jsonl" > /dev/null
    else
      "$bin" "${args[@]}" "${extra[@]}" --log-file "$log/$name.$side.$RANDOM.jsonl" > /dev/null
    fi
  done
done
for side in before after; do
  bin=$before
  [ "$side" = after ] && bin=$after
  "$bin" "${args[@]}" --batch 8 --steps 6 --profile-steps 2:6 --profile-dir "$log/prof.$side" \
    > /dev/null
done
python3 - "$log" "$steps" "$base" > "$out" << 'PY'
import collections, datetime, glob, json, os, statistics, sys
log, steps, base = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names = {"f32": "1 rank, f32 (8 x 256)", "bf16": "1 rank, bf16 params (8 x 256)",
         "np2": "2 ranks Gloo, f32, 2 microbatches (2 x 2 x 4 x 256)"}
print(f"# The step's traffic, before ({base}) vs after, tiny llama, --grad-clip 1, CPU "
      f"({datetime.date.today()}, {os.cpu_count()} cores)\n")
print("| run | before, ms | after, ms | before / after | losses and grad norms |")
print("| --- | --- | --- | --- | --- |")
for name, title in names.items():
    res = {}
    for side in ("before", "after"):
        runs = [[json.loads(l) for l in open(f)]
                for f in sorted(glob.glob(f"{log}/{name}.{side}.*.jsonl"))]
        ms = [statistics.mean(r["step_ms"] for r in run[2:]) for run in runs]  # steps 2.. (warm)
        res[side] = (min(ms), [[(r["loss"], r["grad_norm"]) for r in run] for run in runs])
    seqs = res["before"][1] + res["after"][1]
    same = "identical" if all(s == seqs[0] for s in seqs) else "DIFFER"
    b, a = res["before"][0], res["after"][0]
    print(f"| {title} | {b:.1f} | {a:.1f} | {b / a:.2f} | {same} over {steps} steps |")
print("\nStep: the best of 3 interleaved runs, each the mean of steps 2 and later.\n")
ops = ("adamw", "clip_scale_", "sum_squares", "add_")
per = {}
for side in ("before", "after"):
    t = json.load(open(f"{log}/prof.{side}/trace_rank0.json"))
    events = t["traceEvents"] if isinstance(t, dict) else t
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("ph") == "X" and e["name"] in ops:
            agg[e["name"]][0] += 1
            agg[e["name"]][1] += e.get("dur", 0) / 1000.0 / 4  # 4 profiled steps
    per[side] = agg
print("Ops the change touches, 1 rank f32 8 x 256, profiled steps 2-5 (ms a step, calls a step):\n")
print("| op | before | after |")
print("| --- | --- | --- |")
for op in ops:
    cells = []
    for side in ("before", "after"):
        n, ms = per[side].get(op, [0, 0.0])
        cells.append(f"{ms:.2f} ms, {n // 4}" if n else "-")
    print(f"| {op} | {cells[0]} | {cells[1]} |")
tot = {s: sum(v[1] for v in per[s].values()) for s in per}
print(f"| total | {tot['before']:.2f} ms | {tot['after']:.2f} ms |")
PY
{
  echo
  echo "The step's tail alone (fsdp-bench-traffic: the reduced gradient's arrival, the norm, the"
  echo "clipping and AdamW over one rank's groups, both sides with this build's kernels; median of"
  echo "15 rounds, each side's best of 3 steps a round, interleaved):"
  echo
  echo "| model | before, ms | after, ms | before / after | parameters and moments |"
  echo "| --- | --- | --- | --- | --- |"
  OMP_WAIT_POLICY=PASSIVE build/bench/fsdp-bench-traffic tiny 15
} >> "$out"
cat "$out"
