#!/usr/bin/env bash
# Nsight Compute on one kernel of fsdp-train, for the micro view (Speed of
# Light, roofline) that the built-in profiler's verdicts summarise:
#   scripts/ncu.sh KERNEL_REGEX [LAUNCH_SKIP] [LAUNCH_COUNT] -- fsdp-train args...
# e.g. scripts/ncu.sh attn_fwd 10 3 -- --preset seed --device cuda --param-dtype bf16 --steps 4
# writes report.ncu-rep (open with ncu-ui, or: ncu --import report.ncu-rep --page details).
set -euo pipefail
kernel=${1:?usage: scripts/ncu.sh KERNEL_REGEX [SKIP] [COUNT] -- fsdp-train args}
skip=${2:-0}
count=${3:-1}
shift $(( $# >= 3 ? 3 : $# ))
[ "${1:-}" = "--" ] && shift
cd "$(dirname "$0")/.."
ncu=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1 || true)}
[ -x "$ncu" ] || { echo "ncu.sh: Nsight Compute (ncu) not found: set NCU=/path/to/ncu" >&2; exit 1; }
# --clock-control none: leave the GPU's clocks as they are (and the H200 machine refuses to lock them).
exec "$ncu" --set full --target-processes all --clock-control none -k "regex:$kernel" -s "$skip" -c "$count" \
  -o report -f "${FSDP_BUILD_DIR:-build}/examples/fsdp-train" "$@"
