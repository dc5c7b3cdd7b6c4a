#!/usr/bin/env bash
# The GPU check, one command for the H200 machine (no network, its own nvcc,
# CMake and PyTorch), under 8 minutes:
#   scripts/gpu_check.sh OUT_DIR
# 1. builds for sm_90 (Release, no MPI/Gloo needed);
# 2. runs the CUDA tests (every op against the CPU, poisoned outputs, the
#    MiniLLM on CUDA against the CPU, NCCL and fully_shard at world size 1);
# 3. measures the ceilings: bf16/f32 GEMM and device-to-device copy;
# 4. trains `--preset seed` for 20 steps in bf16 (param bf16, reduce f32) on
#    one GPU, and runs the reference PyTorch FSDP2 script with the same config
#    on the same GPU (torchrun, 1 process);
# 5. writes OUT_DIR/summary.md (commit it as bench/results/gpu-<date>.md) and the logs.
# Packages missing there are unpacked from .debs/ (see scripts/gpu-debs.sh).
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
start=$(date +%s)
log() { echo "[gpu_check $(($(date +%s) - start))s] $*" | tee -a "$out/check.log"; }

if [ -d .debs ] && ! [ -f /usr/include/fmt/core.h ]; then
  log "unpacking $(ls .debs/*.deb | wc -l) carried packages"
  for f in .debs/*.deb; do dpkg -x "$f" / ; done
  ldconfig
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
log "gpu: $(cat "$out/gpu.txt")"

build=build-gpu
log "configure + build (sm_90)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DFSDP_MPI=OFF -DFSDP_GLOO=OFF > "$out/build.log" 2>&1 \
  && cmake --build "$build" -j "$(nproc)" >> "$out/build.log" 2>&1
build_rc=$?
log "build rc=$build_rc"
[ $build_rc -eq 0 ] || { tail -40 "$out/build.log"; exit 1; }

log "CUDA tests"
FSDP_CUDA_POISON=1 timeout 240 "$build/tests/cuda_test" > "$out/cuda_test.log" 2>&1
test_rc=$?
grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_test.log" | tee -a "$out/check.log"
timeout 120 "$build/tests/ops_test" > "$out/ops_test.log" 2>&1 || test_rc=1

log "ceilings"
timeout 60 "$build/bench/fsdp-bench-gpu" > "$out/ceilings.log" 2>&1
cat "$out/ceilings.log" | tee -a "$out/check.log"

log "fsdp-train --preset seed, bf16, 20 steps"
timeout 240 "$build/examples/fsdp-train" --preset seed --device cuda --param-dtype bf16 --reduce-dtype f32 --steps 20 \
  > "$out/fsdp_train.log" 2>&1
train_rc=$?
tail -3 "$out/fsdp_train.log" | tee -a "$out/check.log"

log "reference PyTorch FSDP2, same config, 20 steps"
timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node 1 bench/torch_fsdp_ref.py --steps 20 \
  > "$out/torch_ref.log" 2>&1
ref_rc=$?
grep -E '^torch-ref:' "$out/torch_ref.log" | tee -a "$out/check.log"

# ------------------------------------------------------------------ summary
ours_tok=$(grep -E '^step ' "$out/fsdp_train.log" | awk 'NR > 2 {s += $7; n++} END {if (n) printf "%.0f", s / n}')
ours_mfu=$(grep -E '^step ' "$out/fsdp_train.log" | awk 'NR > 2 {gsub("%", "", $11); s += $11; n++} END {if (n) printf "%.1f", s / n}')
ours_peak=$(grep -oE 'peak mem [0-9.]+ MB' "$out/fsdp_train.log" | grep -oE '[0-9.]+')
ref_tok=$(grep -oE 'torch-ref: tok/s [0-9]+' "$out/torch_ref.log" | grep -oE '[0-9]+$')
ref_peak=$(grep -oE '\| peak [0-9.]+ GB' "$out/torch_ref.log" | grep -oE '[0-9.]+')
ratio=$(awk -v a="${ours_tok:-0}" -v b="${ref_tok:-0}" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "n/a"}')
{
  echo "# GPU check: $(date -u +%Y-%m-%d)"
  echo
  echo "GPU: $(cat "$out/gpu.txt"). Build: sm_90, Release. Ceilings: $(sed 's/gpu-ceilings: //' "$out/ceilings.log")."
  echo
  echo "## Tests"
  echo '```'
  grep -E '^\[  (PASSED|FAILED|SKIPPED|  OK) |^\[ +(OK|FAILED) \]' "$out/cuda_test.log" | head -40
  echo '```'
  echo "cuda_test exit ${test_rc}."
  echo
  echo "## MiniLLM seed preset, bf16 params, f32 reduce, one GPU, 20 steps"
  echo
  echo "| | tokens/s (steps 2..19) | MFU (vs measured bf16 GEMM) | peak memory |"
  echo "| --- | ---: | ---: | ---: |"
  echo "| fsdp-train | ${ours_tok:-failed} | ${ours_mfu:-?}% | ${ours_peak:-?} MB |"
  echo "| PyTorch FSDP2 reference | ${ref_tok:-failed} | | ${ref_peak:-?} GB |"
  echo
  echo "**fsdp-train / PyTorch tokens/s: ${ratio}** (goal: 1.2). fsdp-train exit ${train_rc}, reference exit ${ref_rc}."
  echo
  echo "## fsdp-train output"
  echo '```'
  grep -vE '^\+|^\|' "$out/fsdp_train.log" | tail -25
  echo '```'
  echo "## Reference output"
  echo '```'
  tail -8 "$out/torch_ref.log"
  echo '```'
} > "$out/summary.md"
log "done: $out/summary.md"
[ $test_rc -eq 0 ] && [ $train_rc -eq 0 ]
