#!/usr/bin/env bash
# Configures and builds fsdp.cpp in build/ (or $FSDP_BUILD_DIR) with the default preset of
# CMakePresets.json (Release, Ninja, ccache when present, CUDA when nvcc is found), plus the -D
# flags in $FSDP_CMAKE_ARGS. Extra arguments are build targets (default: everything).
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths relative to the checkout in ccache's hashes: another clone of the same commit (CI's fresh
# one) compiles from the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
build=${FSDP_BUILD_DIR:-build}
if [ ! -f "$build/build.ninja" ]; then
  mkdir -p "$build"
  # shellcheck disable=SC2086 # FSDP_CMAKE_ARGS is a list of -D flags
  cmake --preset default -B "$build" ${FSDP_CMAKE_ARGS:-} > "$build/configure.log" 2>&1 \
    || { cat "$build/configure.log"; exit 1; }
  grep -E '^-- fsdp:' "$build/configure.log" || true
fi
if [ $# -gt 0 ]; then
  cmake --build "$build" --target "$@"
else
  cmake --build "$build"
fi
