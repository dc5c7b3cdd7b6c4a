#!/usr/bin/env bash
# The GPU check's build, done here before a device machine starts, so that none of its minutes go
# to compiling: a Release tree for sm_90 (the H200) with cuDNN's SDPA and Gloo, the CPU kernels
# built without -march=native (the device's CPU is not this one), RPATHs relative to the tree
# ($ORIGIN), and only what scripts/gpu_check.sh runs, stripped: cuda_test, fsdp-train,
# fsdp-generate, the two GPU benches, libfsdp.so and the CUDA objects cuda_objects_test reads.
#   scripts/gpu_prebuild.sh [DIR]          (default .gpu-prebuilt; ignored by git)
# then, on the device (carry DIR and .debs; DIR must stay under the carry's 64 MiB with .debs):
#   scripts/gpu_check.sh --prebuilt DIR OUT_DIR
# which uses DIR where its programs load there and builds as before where they do not.
# Open MPI is left out (.debs does not stage it; the check's multi-rank stages run on Gloo).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-prebuilt}
work=${FSDP_PREBUILD_WORK:-build-prebuild}
log=$work/fsdp-configure.log
mkdir -p "$work"
fe=build/_deps/cudnn-frontend/include
[ -f "$fe/cudnn_frontend.h" ] || { echo "gpu_prebuild: no cudnn-frontend headers in $fe (scripts/install-deps.sh)" >&2; exit 1; }
[ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu_prebuild: no CUDA toolkit in /usr/local/cuda" >&2; exit 1; }
targets=(cuda_test fsdp-train fsdp-generate fsdp-bench-gpu fsdp-bench-kernels)
cmake -S . -B "$work" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DFSDP_CUDNN=ON -DFSDP_CUDNN_FRONTEND_DIR="$PWD/$fe" -DFSDP_NATIVE=OFF -DFSDP_MPI=OFF -DFSDP_GLOO=ON \
  -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON > "$log" 2>&1 \
  || { tail -30 "$log" >&2; exit 1; }
grep -E '^-- fsdp:' "$log"
grep -qE '^-- fsdp:.* NCCL=ON' "$log" \
  || { echo "gpu_prebuild: this build has no NCCL, and --device cuda needs it" >&2; exit 1; }
cmake --build "$work" --target "${targets[@]}"
rm -rf "$dir"
mkdir -p "$dir/tests" "$dir/examples" "$dir/bench"
cp "$work/tests/cuda_test" "$dir/tests/"
cp "$work/examples/fsdp-train" "$work/examples/fsdp-generate" "$dir/examples/"
cp "$work/bench/fsdp-bench-gpu" "$work/bench/fsdp-bench-kernels" "$dir/bench/"
cp -P "$work"/libfsdp.so* "$dir/"
(cd "$work" && find CMakeFiles/fsdp.dir -name '*.cu.o' -print0 | xargs -0 -r cp --parents -t "$OLDPWD/$dir")
find "$dir" -type f \( -name 'libfsdp.so*' -o -perm -u+x \) ! -name '*.o' -exec strip --strip-unneeded {} +
cp "$log" "$dir/configure.log"
echo "built $(date -u +%Y-%m-%dT%H:%MZ) at $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with local changes') on $(uname -n)" \
  > "$dir/PREBUILT"
# Each program must load here: ldd finds every library (the device's check asks the same).
for t in tests/cuda_test examples/fsdp-train examples/fsdp-generate bench/fsdp-bench-gpu bench/fsdp-bench-kernels; do
  if ldd "$dir/$t" | grep -q 'not found'; then
    echo "gpu_prebuild: $dir/$t does not load here: $(ldd "$dir/$t" | grep 'not found' | tr -s ' \n' ' ')" >&2
    exit 1
  fi
done
mib=$(du -sm "$dir" | cut -f1)
debs=$(du -sm .debs 2> /dev/null | cut -f1 || echo 0)
echo "gpu_prebuild: $dir, ${mib} MiB ($(cat "$dir/PREBUILT")); with .debs (${debs:-0} MiB) it must stay under 64 MiB"
[ "$mib" -lt 56 ] || { echo "gpu_prebuild: $dir is ${mib} MiB, too big to carry" >&2; exit 1; }
