#!/usr/bin/env bash
# Each bench/ script starts and writes its results file, at its smallest size, on the build under
# test (CI has no time for the real sizes): activation_checkpoint.sh and async_checkpoint.sh
# --dry-run (a tiny model, results to a temporary file), finetune.sh
# --dry-run (runs nothing, checks what it needs), collectives.sh up to 4 KiB, fsdp_cpu.sh 2 steps,
# generate.sh, cpu_vs_torch.sh 1 thread 3 steps (where the python it uses has torch; else
# reported skipped), moe_fsdp2.sh --tiny (where FSDP_TORCH_PYTHON, default /opt/torchref/bin/python,
# has torch and transformers' Qwen3-MoE; else reported skipped; it writes to stdout only). Results go to a scratch folder (FSDP_BENCH_OUT), never bench/results/.
#   tests/bench_start_test.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:?usage: bench_start_test.sh BUILD_DIR}")
if [ "$build" != "$(realpath build)" ]; then
  # The bench scripts run the binaries of build/ in the checkout.
  echo "bench_start_test: skipped: the bench scripts use ./build, and the build under test is $build"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FSDP_BENCH_NO_BUILD=1 FSDP_CACHE_DIR="$work/cache"
failed=0
check() {  # NAME OUTFILE COMMAND...: the command exits 0 and OUTFILE (if not -) is non-empty
  local name=$1 outfile=$2 t=$SECONDS
  shift 2
  if ! FSDP_BENCH_OUT="$outfile" "$@" > "$work/$name.log" 2>&1; then
    echo "FAIL $name: exit non-zero; its output ends:"
    tail -20 "$work/$name.log" | sed 's/^/    /'
    failed=1
  elif [ "$outfile" != - ] && [ ! -s "$outfile" ]; then
    echo "FAIL $name: exit 0 but it wrote no $outfile"
    failed=1
  else
    echo "ok $name ($((SECONDS - t)) s)"
  fi
}
check activation_checkpoint - bash bench/activation_checkpoint.sh --dry-run
check async_checkpoint - bash bench/async_checkpoint.sh --dry-run
check finetune - bash bench/finetune.sh --dry-run
check collectives "$work/collectives.md" bash bench/collectives.sh 4096
check fsdp_cpu "$work/fsdp-cpu.md" bash bench/fsdp_cpu.sh 2
check generate "$work/generate.md" bash bench/generate.sh
if "${PYTHON:-/usr/bin/python3}" -c "import torch" 2> /dev/null; then
  check cpu_vs_torch "$work/cpu-tiny.md" bash bench/cpu_vs_torch.sh 1 3
else
  echo "skipped cpu_vs_torch: ${PYTHON:-/usr/bin/python3} has no torch (Debian: python3-torch)"
fi
torch_py=${FSDP_TORCH_PYTHON:-/opt/torchref/bin/python}
if "$torch_py" -c "from transformers import Qwen3MoeForCausalLM" 2> /dev/null; then
  check moe_fsdp2 - bash bench/moe_fsdp2.sh --tiny
else
  echo "skipped moe_fsdp2: $torch_py has no torch and transformers with Qwen3-MoE (bench/setup_torch_ref.sh)"
fi
[ $failed = 0 ] || exit 1
echo "bench_start_test: every bench script started and wrote its results"
