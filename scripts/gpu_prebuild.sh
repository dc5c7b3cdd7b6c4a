#!/usr/bin/env bash
# The GPU check's build, done here before a device machine starts, so that none of its minutes go
# to compiling: a Release tree for sm_90 (the H200) with cuDNN's SDPA and Gloo, the CPU kernels
# built without -march=native (the device's CPU is not this one), RPATHs relative to the tree
# ($ORIGIN), and only what scripts/gpu_check.sh runs, stripped: cuda_test, fsdp-train,
# fsdp-generate, the two GPU benches, libfsdp.so and the CUDA objects cuda_objects_test reads.
#   scripts/gpu_prebuild.sh [DIR]          (default .gpu-prebuilt; ignored by git)
# then, on the device (carry DIR and .debs; the tree, DIR and .debs together must stay under the
# call's 64 MiB, which the prebuild checks and prints):
#   scripts/gpu_check.sh --prebuilt DIR OUT_DIR
# which uses DIR where its programs load there and builds as before where they do not.
# Open MPI is left out (.debs does not stage it; the check's multi-rank stages run on Gloo).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-prebuilt}
work=${FSDP_PREBUILD_WORK:-build-prebuild}
log=$work/fsdp-configure.log
mkdir -p "$work"
# The check's own configure (scripts/gpu_build.sh), with the CPU kernels for any x86-64, no MPI and
# RPATHs relative to the tree.
# shellcheck source=scripts/gpu_build.sh
source scripts/gpu_build.sh
gpu_find_libs
[ -f "$fe_dir/cudnn_frontend.h" ] || { echo "gpu_prebuild: no cudnn-frontend headers in $fe_dir (scripts/install-deps.sh)" >&2; exit 1; }
[ -x "$cuda_home/bin/nvcc" ] || { echo "gpu_prebuild: no CUDA toolkit in $cuda_home" >&2; exit 1; }
# The device's cuDNN version (gpu_device_cudnn: its PyTorch's pin) in the headers compiled against,
# so that the graphs the frontend builds are the ones that cuDNN takes there.
headers=$(gpu_cudnn_headers)
if [ "$headers" != "$gpu_device_cudnn" ]; then
  echo "gpu_prebuild: the cuDNN headers here are ${headers:-missing}, the device loads $gpu_device_cudnn (its PyTorch's" \
    "nvidia-cudnn-cu13 wheel): python3 -m pip download --no-deps --only-binary=:all: nvidia-cudnn-cu13==$gpu_device_cudnn.*" \
    "-d DIR, unzip it, and run again with FSDP_PREBUILD_CUDNN_ROOT=DIR/nvidia/cudnn" >&2
  exit 1
fi
gpu_cmake_args "$work"
"${gpu_cmake[@]}" -DFSDP_NATIVE=OFF -DFSDP_MPI=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON > "$log" 2>&1 \
  || { tail -30 "$log" >&2; exit 1; }
grep -E '^-- fsdp:' "$log"
why=$(gpu_nccl_why "$log")
[ -z "$why" ] || { echo "gpu_prebuild: this build has no NCCL, and --device cuda needs it: $why" >&2; exit 1; }
cmake --build "$work" --target "${gpu_targets[@]}"
rm -rf "$dir"
mkdir -p "$dir/tests" "$dir/examples" "$dir/bench"
cp "$work/tests/cuda_test" "$dir/tests/"
cp "$work/examples/fsdp-train" "$work/examples/fsdp-generate" "$dir/examples/"
cp "$work/bench/fsdp-bench-gpu" "$work/bench/fsdp-bench-kernels" "$dir/bench/"
cp -P "$work"/libfsdp.so* "$dir/"
(cd "$work" && find CMakeFiles/fsdp.dir -name '*.cu.o' -print0 | xargs -0 -r cp --parents -t "$OLDPWD/$dir")
find "$dir" -type f \( -name 'libfsdp.so*' -o -perm -u+x \) ! -name '*.o' -exec strip --strip-unneeded {} +
cp "$log" "$dir/configure.log"
echo "built $(date -u +%Y-%m-%dT%H:%MZ) at $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with local changes') on $(uname -n), against cuDNN $headers (the device's $gpu_device_cudnn)" \
  > "$dir/PREBUILT"
# Each program must load here (the device's check asks the same).
export LD_LIBRARY_PATH="$gpu_ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
gpu_loads "$dir" || { echo "gpu_prebuild: $dir does not load here: $gpu_why" >&2; exit 1; }
# The whole carry: the tree as it travels, this folder and .debs, against the call's 64 MiB.
echo "gpu_prebuild: $dir ($(cat "$dir/PREBUILT"))"
carry=$(gpu_carry "$dir" .debs) || { echo "gpu_prebuild: too big to carry: $carry" >&2; exit 1; }
echo "gpu_prebuild: $carry"
[ -d .debs ] || echo "gpu_prebuild: no .debs here yet (scripts/gpu_debs.sh stages about 19 MiB): count them in" >&2
