#!/usr/bin/env bash
# fsdp-train's step with each CPU BLAS library (issue 55), beside bench/gemm_libs.sh's GEMM rates:
# fsdp-train is built once per installed library (FSDP_BLAS=..., in build/; only
# kernels/cpu/gemm.cpp differs, so each is a compile of one file and a link) and copied with its
# libfsdp.so to build/blas-steps/LIBRARY/; then the tiny preset trains for a few steps at 1 and 2
# threads, the libraries alternating each round. The build's FSDP_BLAS is set back to auto at
# the end. Prints, and writes to bench/results/gemm-libs-step-cpu.md, the median over rounds of
# each library's mean ms/step (steps 1.., step 0 warms up) and the losses of its last round (a
# different library sums in another order: they agree to about 1e-6 relative).
# FSDP_BENCH_LIBS="openblas mkl" limits the libraries; FSDP_BENCH_NO_BUILD=1 reuses the binaries.
#   bench/gemm_libs_step.sh [rounds] [steps] [extra fsdp-train flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-4}
shift $(($# > 2 ? 2 : $#))
extra=("$@")
[ ${#extra[@]} -gt 0 ] || extra=(--batch 2)
out=${FSDP_BENCH_OUT:-bench/results/gemm-libs-step-cpu.md}
dest=build/blas-steps
libs=()
for lib in ${FSDP_BENCH_LIBS:-openblas scipy-openblas blis mkl}; do
  if [ -z "${FSDP_BENCH_NO_BUILD:-}" ]; then
    cmake -B build -DFSDP_BLAS="$lib" . > "$dest.configure.log" 2>&1 || continue
    scripts/build.sh fsdp-train > /dev/null
    rm -rf "${dest:?}/$lib" && mkdir -p "$dest/$lib"
    cp -L build/examples/fsdp-train build/libfsdp.so.0 "$dest/$lib/"
  fi
  [ -x "$dest/$lib/fsdp-train" ] && libs+=("$lib")
done
[ -n "${FSDP_BENCH_NO_BUILD:-}" ] || cmake -B build -DFSDP_BLAS=auto . > "$dest.configure.log" 2>&1
[ ${#libs[@]} -gt 0 ] || { echo "gemm_libs_step: no library built" >&2; exit 1; }

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
export FSDP_GEMM_PEAK_GFLOPS=1 OMP_WAIT_POLICY=PASSIVE  # no peak measurement: the steps alone
n=${#libs[@]}
for r in $(seq 1 "$rounds"); do
  for threads in 1 2; do
    for i in $(seq 0 $((n - 1))); do
      lib=${libs[$(((i + r) % n))]}
      LD_LIBRARY_PATH=$dest/$lib "$dest/$lib/fsdp-train" --preset tiny --steps "$steps" --threads "$threads" \
        --seed 1 "${extra[@]}" --log-file "$log/$lib.$threads.$r.jsonl" > "$log/$lib.$threads.$r.out" 2>&1 \
        || { echo "gemm_libs_step: $lib failed:" >&2; tail -5 "$log/$lib.$threads.$r.out" >&2; exit 1; }
    done
  done
done

python3 - "$log" "$rounds" "$out" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)" \
  "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(git rev-parse --short HEAD)" "$steps" \
  "${extra[*]}" "${libs[@]}" << 'PY'
import datetime, json, os, re, statistics, sys
log, rounds, out, cpu, ncpu, load, commit, steps, extra = sys.argv[1:10]
libs = sys.argv[10:]
rounds = int(rounds)
def run(lib, t, r):
    rows = [json.loads(l) for l in open(os.path.join(log, f"{lib}.{t}.{r}.jsonl"))]
    return statistics.mean(x["step_ms"] for x in rows[1:]), [x["loss"] for x in rows]
def row(lib, name):
    text = open(os.path.join(log, f"{lib}.1.1.out")).read()
    m = re.search(r"^\| " + name + r" +\| (.*?) +\|$", text, re.M)
    return m.group(1) if m else "?"
L = ["# CPU: fsdp-train's tiny preset step with each BLAS library", "",
     f"Run: `bench/gemm_libs_step.sh {rounds} {steps} {extra}` (fsdp.cpp {commit}) on {datetime.date.today()}, "
     f"{cpu}, {ncpu} cores; load average at the end {load}: **measured under load** (a machine "
     f"shared with other engineers' builds and tests). ms/step: the mean over steps 1..{int(steps) - 1}, "
     f"median of {rounds} alternating rounds.", "",
     "| library | kernels | ms/step x1 | ms/step x2 | vs " + libs[0] + " x1 | vs " + libs[0] + " x2 |",
     "| --- | --- | ---: | ---: | ---: | ---: |"]
base = {t: statistics.median(run(libs[0], t, r)[0] for r in range(1, rounds + 1)) for t in (1, 2)}
for lib in libs:
    ms = {t: statistics.median(run(lib, t, r)[0] for r in range(1, rounds + 1)) for t in (1, 2)}
    L.append(f"| {row(lib, 'blas library')} | {row(lib, 'blas kernels')} | {ms[1]:.1f} | {ms[2]:.1f} | "
             f"{base[1] / ms[1]:.2f}x | {base[2] / ms[2]:.2f}x |")
L += ["", "Speed-up: " + libs[0] + "'s ms/step over the library's. Losses (round " + str(rounds) + ", 2 threads):", "",
      "| step | " + " | ".join(libs) + " | max rel diff |", "| ---: |" + " ---: |" * (len(libs) + 1)]
losses = {lib: run(lib, 2, rounds)[1] for lib in libs}
for s in range(len(losses[libs[0]])):
    v = [losses[lib][s] for lib in libs]
    rel = max(abs(x - v[0]) / abs(v[0]) for x in v)
    L.append(f"| {s} | " + " | ".join(f"{x:.8f}" for x in v) + f" | {rel:.1e} |")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
