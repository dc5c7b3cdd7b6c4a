#!/usr/bin/env bash
# The GPU check's build step, in one place: where the machine keeps CUDA, cuDNN, NCCL and the
# cudnn-frontend headers, the configure command, and whether the programs built load.
# scripts/gpu_check.sh and scripts/gpu_prebuild.sh source it; tests/gpu_layout_test.sh runs it
# on a rehearsal of the device's layout (a CUDA tree without cuDNN or NCCL, PyTorch's nvidia/
# wheel folders holding only libcudnn.so.9 and libnccl.so.2):
#   scripts/gpu_build.sh BUILD_DIR [CMAKE_ARG...]
# configures (BUILD_DIR/configure.log), stops where the build has no NCCL (exit 3, naming where
# CMake looked), builds the check's programs and checks that each loads (exit 4 naming the
# missing library). Reads CUDA_HOME (default /usr/local/cuda), FSDP_CUDNN_FRONTEND_DIR, and
# python3 for the wheels' folders.

gpu_targets=(cuda_test fsdp-train fsdp-generate fsdp-bench-gpu fsdp-bench-kernels)
gpu_programs=(tests/cuda_test examples/fsdp-train examples/fsdp-generate bench/fsdp-bench-gpu
  bench/fsdp-bench-kernels)

# gpu_find_libs: sets cuda_home, cudnn_root and nccl_root (a wheel's folder, empty where the CUDA
# tree or the system has the library), fe_dir, nvrtc_builtins and gpu_ld_path (the library path
# the check's programs run with). Run from the checkout's root.
gpu_find_libs() {
  cuda_home=${CUDA_HOME:-/usr/local/cuda}
  # cuDNN: the CUDA tree's, or PyTorch's wheel (include/ and lib/libcudnn.so.9, no unversioned link).
  cudnn_root=${FSDP_PREBUILD_CUDNN_ROOT:-}
  [ -n "$cudnn_root" ] || [ -f "$cuda_home/include/cudnn.h" ] \
    || cudnn_root=$(timeout 30 python3 -c 'import nvidia.cudnn as c; print(list(c.__path__)[0])' 2> /dev/null || true)
  # NCCL: the CUDA tree's, the system's, or PyTorch's wheel (nvidia/nccl: lib/libnccl.so.2 and no
  # libnccl.so); CMakeLists.txt looks in the same places, given the wheel's folder as FSDP_NCCL_ROOT.
  nccl_root=""
  [ -f "$cuda_home/include/nccl.h" ] || [ -f /usr/include/nccl.h ] \
    || nccl_root=$(timeout 30 python3 -c 'import nvidia.nccl as c; print(list(c.__path__)[0])' 2> /dev/null || true)
  fe_dir=${FSDP_CUDNN_FRONTEND_DIR:-$PWD/.debs/cudnn-frontend/include}
  [ -f "$fe_dir/cudnn_frontend.h" ] || fe_dir=$PWD/build/_deps/cudnn-frontend/include
  # cuDNN's runtime-compiled engines load libnvrtc-builtins.so.13 next to libnvrtc: without it on
  # the path they refuse every shape and attention falls back to our kernel, silently.
  local d nv libdirs=()
  nvrtc_builtins=""
  for d in "$cuda_home/lib64" "$cuda_home/targets/x86_64-linux/lib"; do
    [ -d "$d" ] || continue
    libdirs+=("$d")
    [ -n "$nvrtc_builtins" ] || nvrtc_builtins=$(ls "$d"/libnvrtc-builtins.so.13* 2> /dev/null | head -1)
  done
  if [ -z "$nvrtc_builtins" ]; then  # PyTorch's wheels (nvidia/cu13/lib or nvidia/cuda_nvrtc/lib)
    nv=$(timeout 30 python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2> /dev/null || true)
    [ -n "$nv" ] && nvrtc_builtins=$(find "$nv" -name 'libnvrtc-builtins.so.13*' 2> /dev/null | head -1)
    [ -n "$nvrtc_builtins" ] && libdirs+=("$(dirname "$nvrtc_builtins")")
  fi
  gpu_ld_path=$(IFS=:; echo "${cudnn_root:+$cudnn_root/lib:}${nccl_root:+$nccl_root/lib:}${libdirs[*]}")
}

# The cuDNN the device loads: its PyTorch 2.11.0 (cu130) pins nvidia-cudnn-cu13==9.19.0.56 (and
# nvidia-nccl-cu13==2.28.9). A tree built against other cuDNN headers runs against this one there.
# shellcheck disable=SC2034 # read by scripts/gpu_prebuild.sh
gpu_device_cudnn=${FSDP_DEVICE_CUDNN:-9.19.0}

# gpu_cudnn_headers: the version (9.19.0) of the cudnn_version.h the build compiles against (the
# wheel's in cudnn_root, else the CUDA tree's or the system's), empty where there is none. After
# gpu_find_libs.
gpu_cudnn_headers() {
  local d h
  for d in ${cudnn_root:+"$cudnn_root/include"} "$cuda_home/include" /usr/include; do
    h=$d/cudnn_version.h
    [ -f "$h" ] || continue
    awk '/^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) / {v[$2] = $3}
      END {if (length(v) == 3) printf "%s.%s.%s\n", v["CUDNN_MAJOR"], v["CUDNN_MINOR"], v["CUDNN_PATCHLEVEL"]}' "$h"
    return 0
  done
}

# gpu_cmake_args BUILD_DIR: the check's configure command, into the array gpu_cmake (sm_90, the
# H200; Release; cuDNN's SDPA; MPI and Gloo; Debian's OpenBLAS, the CPU BLAS gpu_debs.sh stages).
# Later -D arguments override these.
gpu_cmake_args() {
  gpu_cmake=(cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON
    -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 -DFSDP_CUDNN=ON
    ${cudnn_root:+-DFSDP_CUDNN_ROOT="$cudnn_root"} ${nccl_root:+-DFSDP_NCCL_ROOT="$nccl_root"}
    -DFSDP_CUDNN_FRONTEND_DIR="$fe_dir" -DFSDP_MPI=ON -DFSDP_GLOO=ON -DFSDP_BLAS=openblas)
}

# gpu_nccl_why CONFIGURE_LOG: prints nothing where the build has NCCL, else where CMake looked for
# it (from its warning) and what to set. --device cuda runs --backend nccl by default: a build
# without NCCL would only refuse there.
gpu_nccl_why() {
  grep -qE '^-- fsdp:.* NCCL=ON' "$1" && return 0
  local where
  where=$(sed -n '/a CUDA build without NCCL/,/^$/p' "$1" | tr -s ' \n' '  ' | grep -oE 'searched [^)]*' \
    | head -1 | sed 's/^searched //')
  echo "CMake searched ${where:-(no warning in $1)}${nccl_root:+ and FSDP_NCCL_ROOT=$nccl_root}$([ -n "$nccl_root" ] \
    || echo ' (python3 found no nvidia.nccl)'); set FSDP_NCCL_ROOT or install libnccl-dev"
}

# gpu_loads DIR [LIST_LOG]: 0 when each program of the check is in DIR and loads (ldd finds every
# library it needs on the current library path) and cuda_test starts (lists its tests, into
# LIST_LOG); else 1, with gpu_why saying what is wrong.
gpu_loads() {
  local dir=$1 list=${2:-/dev/null} t missing
  gpu_why=""
  for t in "${gpu_programs[@]}"; do
    [ -x "$dir/$t" ] || { gpu_why="$t is not there"; return 1; }
    missing=$(ldd "$dir/$t" 2> /dev/null | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
    [ -z "$missing" ] || { gpu_why="$t needs ${missing% }, not found here"; return 1; }
  done
  timeout 30 "$dir/tests/cuda_test" --gtest_list_tests > "$list" 2>&1 \
    || { gpu_why="tests/cuda_test --gtest_list_tests failed: $(tail -1 "$list")"; return 1; }
}

# gpu_carry [DIR...]: the size of what a device call carries, against its 64 MiB: the working tree
# as it travels (git's tracked files and the untracked ones it does not ignore; where there is no
# git, as on the device's copy, every file here but DIR... and the check's own build-gpu) and each
# carried DIR that exists. Prints "carry: tree T MiB + DIR D MiB ... = N MiB of 64 MiB"; returns 1
# when N is over 64 MiB. Run from the checkout's root.
gpu_carry() {
  local tree d b total=0 parts=() ex=()
  mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
  if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    tree=$(git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s -- 2> /dev/null \
      | awk '{s += $1} END {print s + 0}')
  else
    for d in "$@" build-gpu; do ex+=(--exclude="$(basename "$d")"); done
    tree=$(du -sb "${ex[@]}" . 2> /dev/null | cut -f1)
  fi
  total=${tree:-0}
  parts+=("tree $(mib "$total") MiB")
  for d in "$@"; do
    [ -e "$d" ] || continue
    b=$(du -sb "$d" | cut -f1)
    total=$((total + b))
    parts+=("$(basename "$d") $(mib "$b") MiB")
  done
  b=$(printf '%s + ' "${parts[@]}")
  echo "carry: ${b% + } = $(mib "$total") MiB of 64 MiB"
  [ "$total" -le $((64 * 1024 * 1024)) ]
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  cd "$(dirname "$0")/.."
  build=${1:?usage: scripts/gpu_build.sh BUILD_DIR [CMAKE_ARG...]}
  shift
  gpu_find_libs
  echo "gpu_build: CUDA $cuda_home; cuDNN ${cudnn_root:-in the CUDA tree}; NCCL ${nccl_root:-in the CUDA tree or the system}; cudnn-frontend $fe_dir"
  gpu_cmake_args "$build"
  mkdir -p "$build"
  "${gpu_cmake[@]}" "$@" > "$build/configure.log" 2>&1 || { tail -30 "$build/configure.log" >&2; exit 1; }
  grep -E '^-- fsdp:' "$build/configure.log"
  why=$(gpu_nccl_why "$build/configure.log")
  [ -z "$why" ] || { echo "gpu_build: no NCCL in this build: $why" >&2; exit 3; }
  cmake --build "$build" --target "${gpu_targets[@]}"
  export LD_LIBRARY_PATH="$gpu_ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  gpu_loads "$build" "$build/cuda_test_list.log" || { echo "gpu_build: $gpu_why" >&2; exit 4; }
  echo "gpu_build: ${#gpu_programs[@]} programs in $build load, cuda_test lists $(grep -c '^  ' "$build/cuda_test_list.log") tests"
fi
