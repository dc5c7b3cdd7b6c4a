#!/usr/bin/env bash
# The other half of the mirrors: a build with CUDA, MPI and Gloo all off still compiles (the
# stubs of src/core/no_cuda.cpp, src/ops/no_cuda_ops.cpp and src/distributed/stubs/ match their
# interfaces), its core and ops tests pass, it trains, and asking it for a missing engine is
# refused by name with a non-zero exit.
set -uo pipefail
src=$1
build=$2
source "$(dirname "$0")/testlib.sh"
cmake -S "$src" -B "$build" --preset bare > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; bad "configure failed"; summary; exit 1; }
grep -q 'fsdp: CUDA=OFF cuDNN=OFF NCCL=OFF MPI=OFF Gloo=OFF' "$build.configure.log" && ok \
  || bad "the stub build is not the bare one: $(grep 'fsdp:' "$build.configure.log")"
cmake --build "$build" --target fsdp-train core_test ops_test > "$build.build.log" 2>&1 \
  || { tail -30 "$build.build.log"; bad "the build without CUDA, MPI and Gloo failed"; summary; exit 1; }
"$build/tests/core_test" > "$build.core.log" 2>&1 && ok || bad "core_test: $(tail -5 "$build.core.log")"
"$build/tests/ops_test" > "$build.ops.log" 2>&1 && ok || bad "ops_test: $(tail -5 "$build.ops.log")"
export OMP_NUM_THREADS=1
out=$("$build/examples/fsdp-train" --steps 1 --seq 64 --batch 2 2>&1) && grep -q '^step 0 | loss' <<< "$out" \
  && ok || bad "training without CUDA, MPI and Gloo: $out"
for b in mpi:MPI gloo:Gloo; do  # (nccl needs --device cuda, refused before: no device)
  out=$("$build/examples/fsdp-train" --steps 1 --backend "${b%%:*}" 2>&1)
  rc=$?
  [ "$rc" -ne 0 ] && grep -q "without.*${b##*:}" <<< "$out" && ok \
    || bad "--backend ${b%%:*} in a build without it: rc $rc, $out"
done
summary
