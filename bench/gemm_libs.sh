#!/usr/bin/env bash
# The GEMM library for this CPU, chosen by measurement (issue 55): fsdp-bench-gemm-libs
# (bench/gemm_libs.cpp) loads each installed candidate with dlopen and times sgemm (and a bf16 x
# bf16 -> f32 GEMM where the library has one) at the tiny preset's and the SmolLM2-135M
# fine-tune's shapes, 1 and 2 threads, in alternating rounds (the order of the libraries turns
# each round). Candidates, where installed (scripts/install-deps.sh and FSDP_BLAS in
# CMakeLists.txt find the same files):
#   openblas        Debian's libopenblas0-openmp (its own kernel choice; OPENBLAS_CORETYPE as
#                   the binaries set it where it fell back to generic kernels, ops/blas.h)
#   scipy-openblas  PyPI scipy-openblas32 (a current OpenBLAS, pthreads, symbols prefixed scipy_)
#   blis            Debian's libblis4-openmp
#   mkl             PyPI mkl (libmkl_rt, GNU OpenMP threading layer, as the build links it), and
#   mkl-avx2        the same with MKL_ENABLE_INSTRUCTIONS=AVX2 (MKL's AVX-512 paths are Intel-only)
# Writes bench/results/gemm-libs-cpu.md: per library and thread count, the median over rounds of
# each shape's GFLOP/s (each the best of 3 batches of about 0.1 s), and of each model's rate over
# all its shapes (total flops / total time: what a step's GEMMs see), by the wall clock and by the
# process's CPU time (on a machine shared with other work, the rate while it held the cores).
#   bench/gemm_libs.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
[ -n "${FSDP_BENCH_NO_BUILD:-}" ] || scripts/build.sh fsdp-bench-gemm-libs > /dev/null
bin=build/bench/fsdp-bench-gemm-libs
out=${FSDP_BENCH_OUT:-bench/results/gemm-libs-cpu.md}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
py_prefix=$(python3 -c 'import sys; print(sys.prefix)' 2> /dev/null || echo /usr/local)
scipy_lib=$(python3 -c 'import scipy_openblas32 as s, os; print(os.path.join(s.get_lib_dir(), "libscipy_openblas.so"))' 2> /dev/null || true)

# name|library|symbol prefix|extra environment
candidates=()
deb=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0
[ -f "$deb" ] && candidates+=("openblas|$deb||")
[ -n "$scipy_lib" ] && [ -f "$scipy_lib" ] && candidates+=("scipy-openblas|$scipy_lib|scipy_|")
blis=/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4
[ -f "$blis" ] && candidates+=("blis|$blis||")
for d in "$py_prefix/lib" /usr/local/lib /opt/intel/oneapi/mkl/latest/lib; do
  if [ -f "$d/libmkl_rt.so.3" ] || [ -f "$d/libmkl_rt.so.2" ]; then
    mkl=$(find "$d" -maxdepth 1 -name 'libmkl_rt.so.[23]' | sort | head -1)
    candidates+=("mkl|$mkl||MKL_THREADING_LAYER=GNU MKL_INTERFACE_LAYER=GNU,LP64")
    candidates+=("mkl-avx2|$mkl||MKL_THREADING_LAYER=GNU MKL_INTERFACE_LAYER=GNU,LP64 MKL_ENABLE_INSTRUCTIONS=AVX2")
    break
  fi
done
[ ${#candidates[@]} -gt 0 ] || { echo "gemm_libs: no BLAS library found" >&2; exit 1; }

# The kernels Debian's OpenBLAS chose, and the re-execution's choice where that is generic.
deb_core=$(python3 -c "import ctypes; l=ctypes.CDLL('$deb'); l.openblas_get_corename.restype=ctypes.c_char_p; print(l.openblas_get_corename().decode())" 2> /dev/null || echo "?")
case $deb_core in Prescott | Core2 | Penryn | Dunnington | Nehalem | Atom | Opteron | Barcelona | Katmai)
  if grep -q avx512f /proc/cpuinfo; then deb_env="OPENBLAS_CORETYPE=SkylakeX"; else deb_env="OPENBLAS_CORETYPE=Haswell"; fi ;;
*) deb_env="" ;;
esac

n=${#candidates[@]}
# FSDP_BENCH_LOGS=DIR: only the report, from the outputs of an earlier (interrupted) run kept in DIR.
if [ -n "${FSDP_BENCH_LOGS:-}" ]; then log=$FSDP_BENCH_LOGS; trap - EXIT; rounds=0; fi
for r in $(seq 1 "$rounds"); do
  for threads in 1 2; do
    for i in $(seq 0 $((n - 1))); do
      c=${candidates[$(((i + r) % n))]}
      IFS='|' read -r name lib prefix extra <<< "$c"
      [ "$name" = openblas ] && extra=$deb_env
      # shellcheck disable=SC2086 # extra is a list of VAR=value
      env OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" \
        BLIS_NUM_THREADS="$threads" OMP_WAIT_POLICY=PASSIVE $extra \
        "$bin" "$lib" "$prefix" "$threads" > "$log/$name.$threads.$r" \
        || { echo "gemm_libs: $name failed:" >&2; cat "$log/$name.$threads.$r" >&2; exit 1; }
      echo "round $r, $threads thread(s): $name done ($(cut -d' ' -f1-3 /proc/loadavg))" >&2
    done
  done
done

[ -n "${FSDP_BENCH_LOGS:-}" ] && rounds=$(find "$log" -maxdepth 1 -name 'openblas.1.*' -printf '%f\n' | sed -n 's/^openblas\.1\.\([0-9]*\)$/\1/p' | sort -n | tail -1)
python3 - "$log" "$rounds" "$out" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)" \
  "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(git rev-parse --short HEAD)" "$deb_core" \
  "${candidates[@]}" << 'PY'
import collections, datetime, os, statistics, sys
log, rounds, out, cpu, ncpu, load, commit, deb_core = sys.argv[1:9]
names = [c.split("|")[0] for c in sys.argv[9:]]
libs = {c.split("|")[0]: c.split("|")[1] for c in sys.argv[9:]}
rounds = int(rounds)
flags = open("/proc/cpuinfo").read()
feat = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16") if f" {f}" in flags]
rate = collections.defaultdict(list)  # (name, threads, shape, dtype, clock) -> GFLOP/s per round
model = collections.defaultdict(list)  # (name, threads, model, dtype, clock) -> GFLOP/s per round
kernels, shapes = {}, []
for name in names:
    for t in (1, 2):
        for r in range(1, rounds + 1):
            secs = collections.defaultdict(float)
            flops = collections.defaultdict(float)
            path = os.path.join(log, f"{name}.{t}.{r}")
            if not os.path.exists(path):  # a round an interrupted run did not reach
                continue
            for line in open(path):
                f = line.split()
                if f[0] == "kernels":
                    kernels[name] = " ".join(f[1:])
                    continue
                m, lay, a, b, c, dt = f[0], f[1], int(f[2]), int(f[3]), int(f[4]), f[5]
                shape = (m, lay, a, b, c)
                if shape not in shapes:
                    shapes.append(shape)
                fl = 2.0 * a * b * c
                for clock, g in (("wall", float(f[6])), ("cpu", float(f[7]))):
                    rate[(name, t, shape, dt, clock)].append(g)
                    flops[(m, dt, clock)] += fl
                    secs[(m, dt, clock)] += fl / (g * 1e9)
            for key in flops:
                model[(name, t) + key].append(flops[key] / secs[key] / 1e9)
med = lambda v: statistics.median(v) if v else None
fmt = lambda v: "" if v is None else f"{v:.1f}"
models = ["tiny", "smollm2", "square"]
L = []
L.append("# CPU: sgemm GFLOP/s of each BLAS library at fsdp-train's shapes")
L.append("")
L.append(f"Run: `bench/gemm_libs.sh {rounds}` (fsdp.cpp {commit}) on {datetime.date.today()}, {cpu}, "
         f"{ncpu} cores ({', '.join(feat)}); load average at the end {load}: **measured under load** "
         "(a machine shared with other engineers' builds and tests), so single figures are noisy; "
         f"the medians of (up to) {rounds} alternating rounds are what to compare.")
L.append("")
L.append("| library | file | kernels |")
L.append("| --- | --- | --- |")
for n in names:
    k = kernels.get(n, "?")
    if n == "openblas" and deb_core != k:
        k += f" (OpenBLAS chose {deb_core}; OPENBLAS_CORETYPE set as the binaries do)"
    L.append(f"| {n} | `{libs[n]}` | {k} |")
L.append("")
def model_table(dtype, clock, names, best=None):
    L.append("| library | " + " | ".join(f"{m} x{t}" for m in models for t in (1, 2)) + " |")
    L.append("| --- |" + " ---: |" * (2 * len(models)))
    for n in names:
        row = []
        for m in models:
            for t in (1, 2):
                v = med(model.get((n, t, m, dtype, clock), []))
                row.append(v)
                if best is not None and v is not None and v > best.get((m, t), (0, ""))[0]:
                    best[(m, t)] = (v, n)
        L.append(f"| {n} | " + " | ".join(fmt(v) for v in row) + " |")
    L.append("")

for clock, what in (("cpu", "by CPU time (flops / the process's CPU seconds: the rate with the cores "
                     "to itself; at 2 threads, threads waiting for each other count)"),
                    ("wall", "by the wall clock (what a step sees on this loaded machine)")):
    L.append(f"## Each model's GEMMs, f32, {what}")
    L.append("")
    L.append("Total flops / total time over the model's shapes below, median of rounds.")
    L.append("")
    best = {}
    model_table("f32", clock, names, best)
    L.append("Fastest: " + "; ".join(f"{m} x{t}: {best[(m, t)][1]} ({best[(m, t)][0]:.1f})"
                                     for m in models for t in (1, 2) if (m, t) in best) + ".")
    L.append("")
bf = [n for n in names if model.get((n, 1, "smollm2", "bf16", "cpu"))]
if bf:
    L.append("## bf16 x bf16 -> f32 GEMM, by CPU time (the libraries that have one)")
    L.append("")
    model_table("bf16", "cpu", bf)
for clock in ("cpu", "wall"):
    L.append(f"## Each shape, f32 GFLOP/s by {'CPU time' if clock == 'cpu' else 'the wall clock'} (median of rounds)")
    L.append("")
    L.append("Row-major, as kernels/cpu/gemm.cpp calls it: NT is a linear layer's forward (x W^T), NN its "
             "input gradient, TN its weight gradient; tiny's 256 x 256 x 64 and 256 x 64 x 256 are "
             "attention's per head.")
    L.append("")
    L.append("| model | layout | m x n x k | " + " | ".join(f"{n} x{t}" for t in (1, 2) for n in names) + " |")
    L.append("| --- | --- | --- |" + " ---: |" * (2 * len(names)))
    for s in shapes:
        L.append(f"| {s[0]} | {s[1]} | {s[2]} x {s[3]} x {s[4]} | " +
                 " | ".join(fmt(med(rate.get((n, t, s, 'f32', clock), []))) for t in (1, 2) for n in names) + " |")
    L.append("")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L[:40]))
PY
