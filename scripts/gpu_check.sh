#!/usr/bin/env bash
# The GPU check, one command for the H200 machine (no network; its own gcc 13,
# nvcc, CMake, PyTorch and cuDNN inside PyTorch's environment), in under 8
# minutes:
#   scripts/gpu_check.sh OUT_DIR
# 1. builds for sm_90 with cuDNN's SDPA (Release; only the targets it runs);
# 2. runs the CUDA tests: every op against the CPU with poisoned outputs,
#    cuDNN attention against our kernel, the MiniLLM on CUDA against the CPU,
#    NCCL and fully_shard at world size 1; the no-exit guard on the objects
#    (compute-sanitizer memcheck on the op tests runs last, if time is left);
# 3. measures the ceilings (bf16/f32 GEMM on random data, device copy) and
#    times each op of the step against its floor (fsdp-bench-kernels), next to
#    PyTorch's SDPA on the same shape (bench/torch_attention.py);
# 4. trains --preset seed for 20 steps (bf16 params, f32 reduce) beside the
#    reference PyTorch FSDP2 script on the same GPU, then --arch llama at the
#    same size beside bench/torch_fsdp_ref.py --arch llama;
# 5. profiles steps 3-4 of the seed run (device times per op);
# 6. runs the multi-rank CUDA path on the one GPU: fsdp-train --device cuda
#    --backend gloo at 1, 2 and 4 processes (tiny llama, f32) must print the
#    losses of 1 rank to 1e-5, with the peak memory per rank falling and the
#    exposed communication reported; a checkpoint saved at 2 CUDA ranks must
#    resume at 1 (CPU and CUDA); and two NCCL ranks on one GPU must be refused
#    with a clear message, not a hang;
# 7. generation on CUDA: fsdp-generate's logits of a prompt on CUDA (f32) against the CPU's,
#    greedy text with and without the KV cache, and decode tokens/s in bf16;
# 8. writes OUT_DIR/summary.md (commit it as bench/results/gpu-<date>.md) and
#    the logs. A stage that would pass the deadline (FSDP_GPU_CHECK_BUDGET_S,
#    450 s) is skipped and named in the summary.
# Packages missing there come from .debs/ (scripts/gpu-debs.sh stages the
# Debian -dev packages and the cudnn-frontend headers; carry .debs).
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
start=$(date +%s)
budget=${FSDP_GPU_CHECK_BUDGET_S:-450}
log() { echo "[gpu_check $(($(date +%s) - start))s] $*" | tee -a "$out/check.log"; }
skipped=()
# Runs a stage only if `need` seconds remain before the deadline.
have_time() {
  local need=$1 name=$2
  if [ $(($(date +%s) - start + need)) -gt "$budget" ]; then
    log "skip: $name (needs ~${need}s, $((budget - $(date +%s) + start))s left)"
    skipped+=("$name")
    return 1
  fi
}

if [ -d .debs ] && ! [ -f /usr/include/fmt/core.h ]; then
  log "unpacking $(ls .debs/*.deb | wc -l) carried packages"
  for f in .debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader \
  > "$out/gpu.txt" 2>&1
log "gpu: $(cat "$out/gpu.txt")"

# cuDNN: the CUDA tree's, or PyTorch's wheel (include/ and lib/libcudnn.so.9, no unversioned link).
cudnn_root=""
[ -f /usr/local/cuda/include/cudnn.h ] \
  || cudnn_root=$(python3 -c 'import nvidia.cudnn as c; print(list(c.__path__)[0])' 2> /dev/null || true)
fe_dir=$PWD/.debs/cudnn-frontend/include
[ -f "$fe_dir/cudnn_frontend.h" ] || fe_dir=$PWD/build/_deps/cudnn-frontend/include
[ -n "$cudnn_root" ] && export LD_LIBRARY_PATH="$cudnn_root/lib:${LD_LIBRARY_PATH:-}"
log "cuDNN: ${cudnn_root:-/usr/local/cuda}; cudnn-frontend: $fe_dir"

build=build-gpu
targets=(cuda_test ops_test fsdp-train fsdp-generate fsdp-bench-gpu fsdp-bench-kernels)  # MPI and Gloo when found
log "configure + build (sm_90): ${targets[*]}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DFSDP_CUDNN=ON ${cudnn_root:+-DFSDP_CUDNN_ROOT="$cudnn_root"} -DFSDP_CUDNN_FRONTEND_DIR="$fe_dir" \
  -DFSDP_MPI=ON -DFSDP_GLOO=ON \
  > "$out/build.log" 2>&1 \
  && cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >> "$out/build.log" 2>&1
build_rc=$?
grep -E '^-- fsdp:' "$out/build.log" | tee -a "$out/check.log"
log "build rc=$build_rc"
[ $build_rc -eq 0 ] || { tail -40 "$out/build.log"; exit 1; }

log "CUDA tests"
FSDP_CUDA_POISON=1 timeout 240 "$build/tests/cuda_test" > "$out/cuda_test.log" 2>&1
test_rc=$?
grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_test.log" | tee -a "$out/check.log"
timeout 120 "$build/tests/ops_test" > "$out/ops_test.log" 2>&1 || test_rc=1
objs=$(find "$build/CMakeFiles/fsdp.dir" -name '*.cu.o')
# shellcheck disable=SC2086 # one argument per object
bash tests/cuda_objects_test.sh $objs > "$out/cuda_objects.log" 2>&1 || test_rc=1
tail -1 "$out/cuda_objects.log" | tee -a "$out/check.log"

log "ceilings and kernels"
timeout 60 "$build/bench/fsdp-bench-gpu" > "$out/ceilings.log" 2>&1
tee -a "$out/check.log" < "$out/ceilings.log"
timeout 120 "$build/bench/fsdp-bench-kernels" > "$out/kernels.md" 2> "$out/kernels.err"
timeout 120 python3 bench/torch_attention.py > "$out/torch_attention.log" 2>&1
tee -a "$out/check.log" < "$out/torch_attention.log"

train=("$build/examples/fsdp-train" --device cuda --param-dtype bf16 --reduce-dtype f32 --steps 20)
ref=(python3 -m torch.distributed.run --standalone --nproc_per_node 1 bench/torch_fsdp_ref.py --steps 20)
train_rc=1 ref_rc=1 ltrain_rc=1 lref_rc=1
log "fsdp-train --preset seed, bf16, 20 steps"
timeout 150 "${train[@]}" --preset seed > "$out/fsdp_train.log" 2>&1
train_rc=$?
tail -3 "$out/fsdp_train.log" | tee -a "$out/check.log"
log "reference PyTorch FSDP2, same config, 20 steps"
timeout 150 "${ref[@]}" > "$out/torch_ref.log" 2>&1
ref_rc=$?
grep -E '^torch-ref:' "$out/torch_ref.log" | tee -a "$out/check.log"
multi="not run" ckpt="not run"
if grep -q 'Gloo=ON' "$out/build.log" && have_time 60 "multi-rank CUDA (gloo)"; then
  log "multi-rank CUDA on one GPU: --backend gloo at 1, 2, 4 processes"
  for n in 1 2 4; do
    timeout 60 python3 scripts/fsdprun --standalone --nproc_per_node $n "$build/examples/fsdp-train" \
      --device cuda --backend gloo --preset tiny --arch llama --vocab 256 --batch $((8 / n)) --steps 6 \
      --log-file "$out/gloo_np$n.jsonl" > "$out/gloo_np$n.log" 2>&1
    rc=$?
    echo "np $n: exit $rc | $(grep -E 'summary \|' "$out/gloo_np$n.log" | sed 's/^\[rank0\]: *//')" \
      | tee -a "$out/check.log" >> "$out/multi.txt"
  done
  multi=$(python3 - "$out" << 'PY'
import json, sys
out = sys.argv[1]
def losses(n):
    try:
        return [json.loads(l)["loss"] for l in open(f"{out}/gloo_np{n}.jsonl")]
    except OSError:
        return []
ref = losses(1)
worst = max((abs(a - b) / abs(b) for n in (2, 4) for a, b in zip(losses(n), ref)), default=None)
ok = ref and all(len(losses(n)) == len(ref) for n in (2, 4)) and worst is not None and worst <= 1e-5
print(f"{'PASS' if ok else 'FAIL'}: largest relative loss difference to 1 rank {worst} over {len(ref)} steps")
PY
)
  log "multi-rank: $multi"
  # A checkpoint of CUDA shards at 2 ranks, resumed at 1 CPU rank and at 1 CUDA rank.
  ck=()
  timeout 60 python3 scripts/fsdprun --standalone --nproc_per_node 2 "$build/examples/fsdp-train" \
    --device cuda --backend gloo --preset tiny --arch llama --vocab 256 --batch 4 --steps 4 \
    --ckpt-dir "$out/ck" --ckpt-every 4 > "$out/ckpt_save.log" 2>&1 && ck+=("saved at 2 CUDA ranks")
  [ ${#ck[@]} -eq 1 ] || ck+=("save at 2 CUDA ranks FAILED, see ckpt_save.log")
  for dev in cpu cuda; do
    [ -d "$out/ck" ] && cp -r "$out/ck" "$out/ck_$dev"
    timeout 60 "$build/examples/fsdp-train" --device $dev --preset tiny --arch llama --vocab 256 --batch 8 \
      --steps 6 --ckpt-dir "$out/ck_$dev" --resume > "$out/ckpt_resume_$dev.log" 2>&1 \
      && grep -q 'resume: loaded' "$out/ckpt_resume_$dev.log" && grep -qE '^step 5 ' "$out/ckpt_resume_$dev.log" \
      && ck+=("resumed on $dev") || ck+=("resume on $dev FAILED")
  done
  ckpt="${ck[*]}"
  log "checkpoints: $ckpt"
fi
refusal="not run"
if have_time 30 "NCCL one-rank-per-GPU refusal"; then
  timeout 60 python3 scripts/fsdprun --standalone --nproc_per_node 2 "$build/examples/fsdp-train" \
    --device cuda --preset tiny --steps 1 > "$out/nccl_np2.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'one rank per GPU' "$out/nccl_np2.log"; then
    refusal="PASS: exit $rc, $(grep -m1 -oE '\[nccl\][^(]*' "$out/nccl_np2.log")"
  else
    refusal="FAIL: exit $rc (124: a hang), see nccl_np2.log"
  fi
  log "nccl refusal: $refusal"
fi

generation="not run"
if have_time 40 "generation on CUDA"; then
  log "fsdp-generate on CUDA: logits against the CPU, the KV cache, decode tokens/s"
  gen=("$build/examples/fsdp-generate" --ckpt "$out/gen_ck")
  timeout 60 "$build/examples/fsdp-train" --device cuda --preset tiny --arch llama --vocab 256 --steps 2 \
    --ckpt-dir "$out/gen_ck" --ckpt-every 2 > "$out/gen_train.log" 2>&1
  for dev in cpu cuda; do
    timeout 60 "${gen[@]}" --device $dev --prompt "The license" --print-logits > "$out/logits_$dev.json" 2>> "$out/gen.log"
  done
  for c in "" --no-kv-cache; do
    timeout 60 "${gen[@]}" --device cuda --prompt "The " --tokens 64 --temperature 0 --ignore-eos $c \
      > "$out/greedy$c.txt" 2>> "$out/gen.log"
  done
  timeout 60 "${gen[@]}" --device cuda --dtype bf16 --prompt "The " --tokens 256 --ignore-eos \
    > /dev/null 2>> "$out/gen.log"
  generation=$(python3 - "$out" << 'PY'
import json, sys
out = sys.argv[1]
try:
    a, b = (json.load(open(f"{out}/logits_{d}.json")) for d in ("cpu", "cuda"))
    diff = max(abs(x - y) for ra, rb in zip(a["logits"], b["logits"]) for x, y in zip(ra, rb))
    same = open(f"{out}/greedy.txt").read() == open(f"{out}/greedy--no-kv-cache.txt").read()
    ok = a["ids"] == b["ids"] and diff <= 1e-3 and same
    print(f"{'PASS' if ok else 'FAIL'}: CUDA logits vs CPU max |diff| {diff:.2e} (goal 1e-3); "
          f"greedy text with and without the KV cache {'equal' if same else 'DIFFERENT'}")
except Exception as e:
    print(f"FAIL: {e!r}")
PY
)
  generation="$generation; bf16 decode: $(grep -oE '[0-9.]+ new tokens in [0-9.]+ s \([0-9.]+ tokens/s\)' "$out/gen.log" | tail -1)"
  log "generation: $generation"
fi

if have_time 90 "llama side by side"; then
  log "fsdp-train --preset seed --arch llama and its PyTorch reference"
  timeout 120 "${train[@]}" --preset seed --arch llama > "$out/fsdp_train_llama.log" 2>&1
  ltrain_rc=$?
  timeout 120 "${ref[@]}" --arch llama > "$out/torch_ref_llama.log" 2>&1
  lref_rc=$?
  grep -E '^torch-ref:' "$out/torch_ref_llama.log" | tee -a "$out/check.log"
fi
if have_time 40 "profile"; then
  log "profile of the seed run, steps 3-4"
  timeout 60 "${train[@]}" --preset seed --steps 6 --profile-steps 3:5 --profile-dir "$out/prof" \
    > "$out/profile.log" 2>&1
fi

# Last, with what time is left: compute-sanitizer on the op tests (slow under the tool).
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null || true)
memcheck="not run"
if [ -n "$sanitizer" ] && have_time 100 "compute-sanitizer"; then
  timeout 90 "$sanitizer" --tool memcheck --leak-check no "$build/tests/cuda_test" \
    --gtest_filter='Dtypes/BackendOps.*' > "$out/memcheck.log" 2>&1
  memcheck="exit $? ($(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1))"
  log "memcheck: $memcheck"
fi

# ------------------------------------------------------------------ summary
tok() { grep -E '^step ' "$1" 2> /dev/null | awk 'NR > 2 {s += $7; n++} END {if (n) printf "%.0f", s / n}'; }
mfu() { grep -E '^step ' "$1" 2> /dev/null | awk 'NR > 2 {gsub("%", "", $11); s += $11; n++} END {if (n) printf "%.1f", s / n}'; }
peak() { grep -E '^step ' "$1" 2> /dev/null | tail -1 | grep -oE 'peak mem [0-9.]+ GB' | grep -oE '[0-9.]+'; }
ref_tok() { grep -oE 'tok/s [0-9]+' "$1" 2> /dev/null | tail -1 | grep -oE '[0-9]+$'; }
ref_peak() { grep -oE '\| peak [0-9.]+ GB' "$1" 2> /dev/null | grep -oE '[0-9.]+'; }
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a"}'; }
attn_ratio() {  # ours (the op: fwd + bwd) / PyTorch's, for causal=0 or 1
  local causal=$1 ours theirs filter=(grep -v causal)
  [ "$causal" = 1 ] && filter=(grep causal)
  ours=$(grep -E '^\| attention(_backward)? \(op\) \|' "$out/kernels.md" 2> /dev/null | "${filter[@]}" \
    | awk -F'|' '{s += $4} END {if (NR == 2) printf "%.3f", s}')
  theirs=$(grep -E "causal=$causal" "$out/torch_attention.log" 2> /dev/null \
    | grep -oE '(fwd|bwd) [0-9.]+' | awk '{s += $2} END {if (NR == 2) printf "%.3f", s}')
  echo "${ours:-?} ms vs ${theirs:-?} ms: $(ratio "$ours" "$theirs")x"
}
{
  echo "# GPU check: $(date -u +%Y-%m-%d)"
  echo
  echo "GPU: $(cat "$out/gpu.txt"). Build: sm_90, Release, $(grep -E '^-- fsdp:' "$out/build.log" | sed 's/^-- //')."
  echo "Ceilings (this run, random data): $(sed 's/gpu-ceilings: //' "$out/ceilings.log")."
  [ ${#skipped[@]} -eq 0 ] || echo "Skipped for time: ${skipped[*]}."
  echo
  echo "## Tests"
  echo '```'
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[ +(OK|FAILED) \]' "$out/cuda_test.log" | head -40
  tail -1 "$out/cuda_objects.log"
  echo '```'
  echo "cuda_test + ops_test + cuda_objects_test exit ${test_rc}; compute-sanitizer memcheck: ${memcheck}."
  echo
  echo "## Training, one GPU, bf16 params, f32 reduce, 20 steps (tokens/s over steps 3-19)"
  echo
  echo "| run | tokens/s | MFU (vs bf16 GEMM ceiling above) | peak memory | exit |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  echo "| fsdp-train --preset seed | $(tok "$out/fsdp_train.log") | $(mfu "$out/fsdp_train.log")% | $(peak "$out/fsdp_train.log") GB | $train_rc |"
  echo "| PyTorch FSDP2 (bench/torch_fsdp_ref.py) | $(ref_tok "$out/torch_ref.log") | | $(ref_peak "$out/torch_ref.log") GB | $ref_rc |"
  echo "| fsdp-train --preset seed --arch llama | $(tok "$out/fsdp_train_llama.log") | $(mfu "$out/fsdp_train_llama.log")% | $(peak "$out/fsdp_train_llama.log") GB | $ltrain_rc |"
  echo "| PyTorch llama reference (--arch llama) | $(ref_tok "$out/torch_ref_llama.log") | | $(ref_peak "$out/torch_ref_llama.log") GB | $lref_rc |"
  echo
  echo "- **seed: fsdp-train / PyTorch tokens/s = $(ratio "$(tok "$out/fsdp_train.log")" "$(ref_tok "$out/torch_ref.log")")** (goal >= 1.2; MFU goal >= 50%; peak memory goal <= PyTorch's)"
  echo "- **llama: fsdp-train / PyTorch tokens/s = $(ratio "$(tok "$out/fsdp_train_llama.log")" "$(ref_tok "$out/torch_ref_llama.log")")** (goal >= 1.2)"
  echo "- attention forward + backward per layer, ours / PyTorch SDPA (goal <= 1.1): non-causal $(attn_ratio 0), causal $(attn_ratio 1)"
  echo
  echo "## Several ranks on the one GPU"
  echo
  echo "fsdp-train --device cuda --backend gloo, tiny llama, f32, global batch 8, 6 steps:"
  echo '```'
  cat "$out/multi.txt" 2> /dev/null
  echo '```'
  echo "- losses against 1 rank (goal 1e-5): ${multi}"
  echo "- two NCCL ranks on one GPU: ${refusal}"
  echo "- checkpoints of CUDA shards: ${ckpt}"
  echo
  echo "## Generation on CUDA (fsdp-generate, tiny llama)"
  echo
  echo "- ${generation}"
  echo
  echo "## Each op of the step against its floor (fsdp-bench-kernels)"
  echo
  cat "$out/kernels.md" 2> /dev/null
  tail -3 "$out/kernels.err" 2> /dev/null
  echo
  echo "PyTorch SDPA on the same shapes:"
  echo '```'
  cat "$out/torch_attention.log"
  echo '```'
  echo "## Profile of the seed run (steps 3-4, device times)"
  echo '```'
  cat "$out/prof/table_rank0.txt" 2> /dev/null || tail -5 "$out/profile.log"
  echo '```'
  echo "## fsdp-train output (seed)"
  echo '```'
  grep -vE '^\+|^\|' "$out/fsdp_train.log" | tail -25
  echo '```'
  echo "## Reference output (seed)"
  echo '```'
  tail -8 "$out/torch_ref.log"
  echo '```'
} > "$out/summary.md"
log "done: $out/summary.md"
[ $test_rc -eq 0 ] && [ $train_rc -eq 0 ]
