#!/usr/bin/env bash
# The GPU check's build on a rehearsal of the device machine's layout (issue 33), so that its one
# run is not lost before a kernel runs. The device has a CUDA tree without cuDNN or NCCL, and
# PyTorch's wheels: nvidia/cudnn and nvidia/nccl, each with include/ and only the versioned
# libraries (libcudnn*.so.9, libnccl.so.2; no unversioned links). Here:
#  1. that layout, made from this machine's CUDA tree (hard links; nvcc finds its tree from where
#     it sits, so it is a copy of the tree and not a link to it), with the wheels on PYTHONPATH and
#     /usr/local (where this machine links its CUDA headers) ignored by CMake;
#  2. scripts/gpu_build.sh, the check's own build step: configure, NCCL found in the wheel, the
#     check's programs built, each loading (ldd) and cuda_test listing its tests;
#  3. every library those programs load comes from the rehearsed CUDA tree or wheels, the build,
#     or a Debian package scripts/gpu_debs.sh stages or counts on the device having: nothing from
#     this machine's own CUDA tree, and no package the device lacks (OpenBLAS's libgfortran5 was
#     once unstaged: the same check with it taken off the list must fail);
#  4. with the NCCL wheel removed, gpu_build.sh stops at the configure, naming where CMake looked.
# Skips only where an input is absent: the CUDA toolkit, its NCCL or cuDNN to make the wheels
# from, the cudnn-frontend headers.
#   gpu_layout_test.sh SOURCE_DIR CUDNN_FRONTEND_INCLUDE_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/testlib.sh
source "$here/testlib.sh"
src=$(cd "${1:?usage: gpu_layout_test.sh SOURCE_DIR FRONTEND_DIR}" && pwd)
fe=${2:?usage: gpu_layout_test.sh SOURCE_DIR FRONTEND_DIR}
cuda=$(readlink -f "${FSDP_LAYOUT_CUDA:-/usr/local/cuda}")
skip() { echo "skipped: $*"; exit 0; }
[ -x "$cuda/bin/nvcc" ] || skip "no CUDA toolkit in $cuda"
[ -f "$fe/cudnn_frontend.h" ] || skip "no cudnn-frontend headers in $fe (scripts/install-deps.sh)"
find_one() {  # find_one NAME DIR...: the first DIR/NAME that exists
  local n=$1 d
  shift
  for d in "$@"; do [ -e "$d/$n" ] && { echo "$d/$n"; return 0; }; done
  return 1
}
nccl_h=$(find_one nccl.h "$cuda/include" /usr/include) || skip "no nccl.h to make the NCCL wheel from"
nccl_so=$(find_one libnccl.so.2 "$cuda/lib64" "$cuda/lib" /usr/lib/x86_64-linux-gnu) || skip "no libnccl.so.2"
cudnn_h=$(find_one cudnn.h "$cuda/include" /usr/include) || skip "no cudnn.h to make the cuDNN wheel from"
cudnn_so=$(find_one libcudnn.so.9 "$cuda/lib64" "$cuda/lib" /usr/lib/x86_64-linux-gnu) || skip "no libcudnn.so.9"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-gpu-layout.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# ------------------------------------------------------------------ 1. the layout
# The CUDA tree, less cuDNN and NCCL: hard links, or (another file system) nvcc's own folders
# copied and the rest linked file by file.
if ! cp -al "$cuda" "$tmp/cuda" 2> /dev/null; then
  rm -rf "$tmp/cuda"
  mkdir -p "$tmp/cuda"
  for e in "$cuda"/*; do
    case $(basename "$e") in
      bin | nvvm) cp -a "$e" "$tmp/cuda/" ;;
      *) if [ -L "$e" ]; then cp -P "$e" "$tmp/cuda/"; else cp -as "$e" "$tmp/cuda/"; fi ;;
    esac
  done
fi
for d in "$tmp/cuda/include" "$tmp/cuda/lib" "$tmp/cuda/lib64" "$tmp/cuda/targets"/*/include \
  "$tmp/cuda/targets"/*/lib; do
  [ -d "$d" ] && [ ! -L "$d" ] && rm -rf "$d"/nccl* "$d"/libnccl* "$d"/cudnn* "$d"/libcudnn*
done
# PyTorch's wheels: nvidia/nccl and nvidia/cudnn, include/ and the versioned libraries only.
site=$tmp/site
mkdir -p "$site/nvidia/nccl/include" "$site/nvidia/nccl/lib" "$site/nvidia/cudnn/include" "$site/nvidia/cudnn/lib"
cp -a "$(dirname "$nccl_h")"/nccl* "$site/nvidia/nccl/include/"
cp -a "$(readlink -f "$nccl_so")" "$site/nvidia/nccl/lib/libnccl.so.2"
cp -a "$(dirname "$cudnn_h")"/cudnn* "$site/nvidia/cudnn/include/"
for f in "$(dirname "$cudnn_so")"/libcudnn*.so.9; do cp -a "$(readlink -f "$f")" "$site/nvidia/cudnn/lib/$(basename "$f")"; done
[ ! -e "$tmp/cuda/include/nccl.h" ] && [ ! -e "$tmp/cuda/lib/libnccl.so.2" ] && [ ! -e "$tmp/cuda/include/cudnn.h" ] \
  && [ ! -e "$site/nvidia/nccl/lib/libnccl.so" ] && ok || bad "the rehearsed CUDA tree still holds NCCL or cuDNN"

layout_env=(env CUDA_HOME="$tmp/cuda" PYTHONPATH="$site" FSDP_CUDNN_FRONTEND_DIR="$fe" PATH="$tmp/cuda/bin:$PATH")
ignore=(-DCMAKE_IGNORE_PREFIX_PATH=/usr/local)

# ------------------------------------------------------------------ 2. the check's build step
build=$tmp/build
t0=$SECONDS
"${layout_env[@]}" bash "$src/scripts/gpu_build.sh" "$build" "${ignore[@]}" > "$tmp/build.log" 2>&1
rc=$?
echo "gpu_build.sh on the device's layout: exit $rc after $((SECONDS - t0)) s"
grep -E '^(gpu_build|-- fsdp):' "$tmp/build.log"
[ $rc -eq 0 ] && ok || { bad "gpu_build.sh failed (exit $rc)"; tail -30 "$tmp/build.log"; }
grep -qE '^-- fsdp: CUDA=ON cuDNN=ON NCCL=ON' "$tmp/build.log" && ok \
  || bad "the build has not CUDA, cuDNN and NCCL: $(grep -E '^-- fsdp:' "$tmp/build.log")"
lib=$(sed -n 's/^NCCL_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt" 2> /dev/null)
[ "$lib" = "$site/nvidia/nccl/lib/libnccl.so.2" ] && ok || bad "NCCL not taken from the wheel: NCCL_LIBRARY=$lib"

# ------------------------------------------------------------------ 3. where every library comes from
# The packages gpu_debs.sh stages or counts on the device having (its --list downloads nothing).
bash "$src/scripts/gpu_debs.sh" --list | awk '{print $2}' | sort -u > "$tmp/packages.txt"
# origins LIST: for each library a program loads, "PROGRAM LIBRARY" where it is neither in the
# rehearsal nor from a package on LIST; 0 when there is none.
ld_path="$site/nvidia/cudnn/lib:$site/nvidia/nccl/lib:$tmp/cuda/lib64"
origins() {
  local list=$1 t l p found=0
  for t in tests/cuda_test examples/fsdp-train examples/fsdp-generate bench/fsdp-bench-gpu \
    bench/fsdp-bench-kernels; do
    [ -x "$build/$t" ] || { echo "$t: not built"; found=1; continue; }
    while read -r l; do
      case $l in "$tmp"/*) continue ;; esac
      p=$(dpkg -S "$l" 2> /dev/null | head -1 | cut -d: -f1)
      [ -n "$p" ] || p=$(dpkg -S "$(readlink -f "$l")" 2> /dev/null | head -1 | cut -d: -f1)
      if [ -z "$p" ]; then
        echo "$t loads $l, which is neither in the device's layout nor from a Debian package"
        found=1
      elif ! grep -qxF "$p" "$list"; then
        echo "$t loads $l from $p, which scripts/gpu_debs.sh neither stages nor counts on the device having"
        found=1
      fi
    done < <(LD_LIBRARY_PATH=$ld_path ldd "$build/$t" 2> /dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
  done
  return $found
}
if origins "$tmp/packages.txt" > "$tmp/origins.txt"; then ok; else bad "libraries from outside the layout:"; cat "$tmp/origins.txt"; fi
grep -vxF libgfortran5 "$tmp/packages.txt" > "$tmp/packages-less.txt"
if ! origins "$tmp/packages-less.txt" > "$tmp/origins-less.txt" && grep -q 'from libgfortran5' "$tmp/origins-less.txt"; then
  ok
else
  bad "the check does not see an unstaged libgfortran5 (OpenBLAS's): $(head -3 "$tmp/origins-less.txt")"
fi
# Where gpu_debs.sh has staged them, each listed package is there.
if [ -d "$src/.debs" ]; then
  while read -r p; do
    grep -qx "staged $p" < <(bash "$src/scripts/gpu_debs.sh" --list) || continue
    ls "$src/.debs/${p}_"*.deb > /dev/null 2>&1 && ok || bad ".debs holds no $p"
  done < "$tmp/packages.txt"
fi

# ------------------------------------------------------------------ 4. no NCCL: refused at the configure
rm -rf "$site/nvidia/nccl"
"${layout_env[@]}" bash "$src/scripts/gpu_build.sh" "$tmp/build-nonccl" "${ignore[@]}" > "$tmp/nonccl.log" 2>&1
rc=$?
[ $rc -eq 3 ] && grep -qE "^gpu_build: no NCCL in this build: CMake searched .*$tmp/cuda" "$tmp/nonccl.log" \
  && [ ! -e "$tmp/build-nonccl/libfsdp.so" ] && ok \
  || { bad "without NCCL, gpu_build.sh did not stop at the configure naming where CMake looked (exit $rc)"; tail -5 "$tmp/nonccl.log"; }
summary
