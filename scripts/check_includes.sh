#!/usr/bin/env bash
# Every file includes what it uses: runs include-what-you-use over each
# header and C++ source of the library, kernels, examples, benchmarks and
# tests, and fails when IWYU says a file "should add" an #include. (gcc 12's
# standard headers pull <cstdint> in by accident and gcc 13's do not, so a
# file that leans on such an accident builds here and breaks on the GPU
# machine; IWYU sees the miss on any compiler.) Only the standard library's
# headers count (the C++ ones and the C ones, <stdint.h> standing for
# <cstdint>): they are what changes with the compiler. A project header or a
# library's (fmt, nlohmann, gtest) reached through another is stable and is
# not reported, nor is IWYU's "should remove" half, its forward-declaration
# advice, or a libstdc++ internal (<bits/...>, <ext/...>). CUDA sources (.cu) are not parsed:
# clang 14 knows no CUDA 13; their host headers are.
#   scripts/check_includes.sh [FILE...]     (default: the whole tree)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v include-what-you-use > /dev/null \
  || { echo "check_includes: include-what-you-use not found (scripts/install-deps.sh installs iwyu)" >&2; exit 1; }

if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files 'include/*.h' 'src/*.h' 'src/*.cpp' 'kernels/*.h' 'kernels/*.cpp' \
    'examples/*.cpp' 'examples/*.h' 'bench/*.cpp' 'tests/*.cpp' 'tests/*.h' 'fuzz/*.cpp' 'fuzz/*.h')
fi

flags=(-std=c++20 -I include -I . -I /usr/include/x86_64-linux-gnu/openblas-openmp
  -I /usr/lib/x86_64-linux-gnu/openmpi/include -I /usr/local/cuda/include
  -DFSDP_WITH_CUDA=1 -DFSDP_WITH_NCCL=1 -DFSDP_WITH_MPI=1 -DFSDP_WITH_GLOO=1 -DFSDP_WITH_CUDNN=1
  '-DFSDP_FIXTURE_DIR=""'
  -Wno-pragma-once-outside-header -Wno-unknown-warning-option -fopenmp
  -Xiwyu --mapping_file=/usr/share/include-what-you-use/gcc.libc.imp
  -Xiwyu --mapping_file=/usr/share/include-what-you-use/gcc.stl.headers.imp
  -Xiwyu --mapping_file=/usr/share/include-what-you-use/gcc.symbols.imp
  -Xiwyu --no_fwd_decls)
fe=${FSDP_BUILD_DIR:-build}/_deps/cudnn-frontend/include  # scripts/install-deps.sh puts it there
if [ -f "$fe/cudnn_frontend.h" ]; then
  flags+=(-isystem "$fe" -DCUDNN_FRONTEND_SKIP_JSON_LIB=1)
else
  mapfile -t files < <(printf '%s\n' "${files[@]}" | grep -v 'attention_cudnn\.cpp$')
fi

# A file whose preprocessed text (with IWYU's version and the flags) passed before is not checked
# again: the key captures every header it reaches, so nothing a change could affect is skipped.
# Paths are relative to the checkout, so another clone of the same tree hits too.
# FSDP_IWYU_CACHE=0 turns the cache off.
cache=${FSDP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp}/iwyu
[ "${FSDP_IWYU_CACHE:-1}" = 0 ] && cache=""
[ -n "$cache" ] && command -v clang++ > /dev/null && mkdir -p "$cache" 2> /dev/null || cache=""
iwyu_version=$(include-what-you-use --version 2>&1 | head -c 200 || true)

# Prints "FILE: should add LINE" for each missing #include of one file.
check_one() {
  local f=$1 out key=""
  if [ -n "$cache" ]; then
    local cpp_flags=()
    for x in "${flags[@]}"; do [[ $x == -Xiwyu || $x == --mapping_file=* || $x == --no_fwd_decls ]] || cpp_flags+=("$x"); done
    key=$( { printf '%s\n' "$iwyu_version" "${flags[@]}" "$f"; clang++ "${cpp_flags[@]}" -E -P -x c++ "$f" 2> /dev/null; } \
      | sha256sum | cut -c1-40)
    [ -f "$cache/$key" ] && return
  fi
  out=$(include-what-you-use "${flags[@]}" -x c++ "$f" 2>&1 || true)
  if grep -q 'error:' <<< "$out"; then
    echo "$f: IWYU could not parse it:"
    grep 'error:' <<< "$out" | head -5
    echo
    return
  fi
  # The "should add" block of the file itself (not of the headers it includes).
  local found
  found=$(awk -v f="$f" '
    $0 == f " should add these lines:" {on = 1; next}
    on && /^$/ {on = 0}
    on && /^#include <[a-z_]+>/ {print f ": should add " $0}
    on && /^#include <(assert|ctype|errno|float|inttypes|limits|math|signal|stdarg|stddef|stdint|stdio|stdlib|string|time|wchar)\.h>/ {
      print f ": should add " $0
    }
  ' <<< "$out")
  if [ -n "$found" ]; then
    echo "$found"
  elif [ -n "$key" ]; then
    touch "$cache/$key"  # passed: not checked again until its preprocessed text changes
  fi
}
export -f check_one
export cache iwyu_version
report=$(printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -I{} bash -c "$(declare -p flags); check_one {}")
if [ -n "$report" ]; then
  echo "$report"
  echo "check_includes: $(grep -c . <<< "$report") problem(s) in ${#files[@]} files" >&2
  exit 1
fi
echo "check_includes: ${#files[@]} files include what they use"
