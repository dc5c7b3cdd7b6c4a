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
#   scripts/check_includes.sh                 the changed set (include_test): the files that differ
#                                             from the last commit where the sweep passed, and
#                                             every file that includes one of them
#   scripts/check_includes.sh --all [--record]  every file (the nightly sweep, .ci/nightly);
#                                             --record writes HEAD and the check's key to
#                                             scripts/check_includes.passed when it passes on a
#                                             tree whose sources are committed
#   scripts/check_includes.sh FILE...         these files
#   scripts/check_includes.sh --list          prints the changed set, checks nothing
# The changed set is honest: a file's verdict depends only on its own text and the project files it
# reaches by #include (and on the compiler's headers and IWYU, which the key below covers), so a
# file outside the set reads the same as where the sweep passed. The base is $FSDP_IWYU_BASE, else the
# commit in scripts/check_includes.passed; when there is none, it is not in the history (a shallow
# clone), or the check's key written beside it differs (the flags, the filter, IWYU, the compiler),
# every file is checked. Files run in parallel, $FSDP_IWYU_JOBS at a time (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v include-what-you-use > /dev/null \
  || { echo "check_includes: include-what-you-use not found (scripts/install-deps.sh installs iwyu)" >&2; exit 1; }

sources=('include/*.h' 'src/*.h' 'src/*.cpp' 'kernels/*.h' 'kernels/*.cpp'
  'examples/*.cpp' 'examples/*.h' 'bench/*.cpp' 'tests/*.cpp' 'tests/*.h' 'fuzz/*.cpp' 'fuzz/*.h')
passed_file=scripts/check_includes.passed
mode=changed record=0 list=0
case "${1:-}" in
  --list) list=1 ;;
  --all) mode=all; [ "${2:-}" = --record ] && record=1 ;;
  -*) echo "usage: scripts/check_includes.sh [--all [--record] | --list | FILE...]" >&2; exit 2 ;;
  "") ;;
  *) mode=files ;;
esac

flags=(-std=c++20 -I include -I . -I /usr/include/x86_64-linux-gnu/openblas-openmp
  -I /usr/lib/x86_64-linux-gnu/openmpi/include -I /usr/local/cuda/include
  -DFSDP_WITH_CUDA=1 -DFSDP_WITH_NCCL=1 -DFSDP_WITH_MPI=1 -DFSDP_WITH_GLOO=1 -DFSDP_WITH_CUDNN=1
  '-DFSDP_FIXTURE_DIR=""'
  -Wno-pragma-once-outside-header -Wno-unknown-warning-option -fopenmp
  -Xiwyu --mapping_file=/usr/share/include-what-you-use/gcc.libc.imp
  -Xiwyu --mapping_file=/usr/share/include-what-you-use/gcc.stl.headers.imp
  -Xiwyu --mapping_file=/usr/share/include-what-you-use/gcc.symbols.imp
  -Xiwyu --no_fwd_decls)

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

# What a verdict depends on besides the files: the sweep's patterns, the flags, the check itself
# (bash prints a function without its comments), IWYU, its mappings and the compiler whose standard
# headers it reads. The base is good only for the same key.
check_key=$( { declare -p sources flags; declare -f check_one; echo "$iwyu_version"; g++ -dumpfullversion
  cat /usr/share/include-what-you-use/gcc.{libc,stl.headers,symbols}.imp || true; } 2> /dev/null | sha256sum | cut -c1-16)

# The checkout's files matching the patterns: committed, staged and new ones (not ignored), less
# the deleted ones.
tree_files() {
  comm -23 <(git ls-files --cached --others --exclude-standard -- "$@" | sort -u) <(git ls-files --deleted -- "$@" | sort -u)
}
graph=('*.h' '*.hpp' '*.cuh' '*.inc' '*.cpp' '*.cu')

# Prints the files of the sweep that include one of the files on stdin (project headers, .inc,
# .cuh), directly or through others, and those files themselves. An #include resolves as the
# compiler's quoted search does (the includer's folder, include/, the root); #if is ignored, so
# the set can only be too large.
with_includers() {
  local changed
  changed=$(cat)
  { tree_files "${graph[@]}" | xargs grep -HE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]' || true; } \
    | awk -v changed="$changed" -v tracked="$(tree_files)" '
      BEGIN {
        n = split(tracked, t, "\n"); for (i = 1; i <= n; i++) exists[t[i]] = 1
        n = split(changed, c, "\n"); for (i = 1; i <= n; i++) if (c[i] != "") { hit[c[i]] = 1; queue[++tail] = c[i] }
      }
      {
        f = substr($0, 1, index($0, ":") - 1)
        inc = $0; sub(/^[^:]*:[^<"]*[<"]/, "", inc); sub(/[>"].*$/, "", inc)
        dir = f; sub(/[^\/]*$/, "", dir)
        split(dir inc "\ninclude/" inc "\n" inc, cand, "\n")
        for (k = 1; k <= 3; k++) {
          p = cand[k]
          while (p ~ /[^\/]+\/\.\.\//) sub(/[^\/]+\/\.\.\//, "", p)
          if (p in exists) includers[p] = includers[p] "\n" f
        }
      }
      END {
        for (head = 1; head <= tail; head++) {
          m = split(includers[queue[head]], by, "\n")
          for (i = 1; i <= m; i++) if (by[i] != "" && !(by[i] in hit)) { hit[by[i]] = 1; queue[++tail] = by[i] }
        }
        for (f in hit) print f
      }'
}

say=1
[ $list = 1 ] && say=2  # --list: the files alone on stdout
case $mode in
  files) files=("$@") ;;
  all) mapfile -t files < <(tree_files "${sources[@]}") ;;
  changed)
    base="" key=""
    [ -f "$passed_file" ] && read -r base key < <(grep -v '^#' "$passed_file")
    [ -n "${FSDP_IWYU_BASE:-}" ] && base=$FSDP_IWYU_BASE key=$check_key
    why=""
    if [ -z "$base" ]; then
      why="no base commit ($passed_file is missing)"
    elif ! git rev-parse -q --verify "$base^{commit}" > /dev/null 2>&1; then
      why="the base $base is not in this clone's history"
    else
      # Committed, staged and unstaged changes since the base, and new files not yet committed.
      changed=$( { git diff --name-only "$base" --; git ls-files --others --exclude-standard; } | sort -u)
      if [ "$key" != "$check_key" ]; then
        why="the check changed since $base (its flags, patterns, filter, IWYU or compiler: key $check_key, not ${key:-none})"
      fi
    fi
    if [ -n "$why" ]; then
      echo "check_includes: every file: $why" >&$say
      mapfile -t files < <(tree_files "${sources[@]}")
    else
      all=$(tree_files "${sources[@]}")
      mapfile -t files < <(with_includers <<< "$changed" | grep -Fxf <(echo "$all") | sort || true)
      echo "check_includes: ${#files[@]} of $(grep -c . <<< "$all") files changed since $(git rev-parse --short "$base")" \
        "(${FSDP_IWYU_BASE:+FSDP_IWYU_BASE=}${FSDP_IWYU_BASE:-$passed_file}) or include one that did" \
        "(scripts/check_includes.sh --all checks every file)" >&$say
    fi
    ;;
esac
unchecked=""
fe=${FSDP_BUILD_DIR:-build}/_deps/cudnn-frontend/include  # scripts/install-deps.sh puts it there
if [ -f "$fe/cudnn_frontend.h" ]; then
  flags+=(-isystem "$fe" -DCUDNN_FRONTEND_SKIP_JSON_LIB=1)
else
  n=${#files[@]}
  mapfile -t files < <(printf '%s\n' "${files[@]}" | grep -v 'attention_cudnn\.cpp$')
  [ ${#files[@]} -eq "$n" ] || unchecked="attention_cudnn.cpp (no cudnn-frontend headers in $fe)"
fi
if [ $list = 1 ]; then
  [ ${#files[@]} -eq 0 ] || printf '%s\n' "${files[@]}"
  exit 0
fi
[ ${#files[@]} -gt 0 ] || { echo "check_includes: no file to check"; exit 0; }

export -f check_one
export cache iwyu_version
jobs=${FSDP_IWYU_JOBS:-$(nproc)}
report=$(printf '%s\n' "${files[@]}" | xargs -P "$jobs" -I{} bash -c "$(declare -p flags); check_one {}")
if [ -n "$report" ]; then
  echo "$report"
  echo "check_includes: $(grep -c . <<< "$report") problem(s) in ${#files[@]} files" >&2
  exit 1
fi
echo "check_includes: ${#files[@]} files include what they use"
if [ $record = 1 ]; then
  if [ -n "$unchecked" ]; then
    echo "check_includes: not recorded: $unchecked was not checked (scripts/install-deps.sh fetches them)"
  elif git diff --quiet HEAD -- "${graph[@]}" && [ -z "$(git ls-files --others --exclude-standard -- "${graph[@]}")" ]; then
    { echo "# The last commit at which scripts/check_includes.sh --all passed, and the key of that check"
      echo "# (written by --all --record); include_test checks what changed since. Commit a newer one."
      echo "$(git rev-parse HEAD) $check_key"; } > "$passed_file"
    echo "check_includes: wrote $(git rev-parse --short HEAD) to $passed_file (commit it to move include_test's base)"
  else
    echo "check_includes: not recorded: sources differ from HEAD (commit them, then run --all --record again)"
  fi
fi
