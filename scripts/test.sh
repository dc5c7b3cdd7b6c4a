#!/usr/bin/env bash
# The test command: installs missing dependencies, builds everything (the CUDA
# files too, when nvcc is found) and runs every test with ctest. GPU tests
# skip with "no CUDA device" on a machine without one. It says what it runs
# before each phase and how long each took.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}  # the tests' own builds (stub, install) too
build=${FSDP_BUILD_DIR:-build}
t0=$SECONDS
phase() { echo "== scripts/test.sh: $* (at $((SECONDS - t0)) s)"; }

phase "scripts/install-deps.sh: installs the Debian packages that are missing"
scripts/install-deps.sh
phase "scripts/build.sh: builds every target into $build (minutes from scratch, seconds when up to date)"
scripts/build.sh
count=$(ctest --test-dir "$build" -N | sed -n 's/^Total Tests: //p')
iwyu=$(scripts/check_includes.sh --list 2> /dev/null | grep -c . || true)
phase "ctest -j $(nproc): $count tests; stub_build_test, readme_test, multinode_test, slurm_test and
   include_test are the long ones. include_test runs IWYU over $iwyu files (those changed since
   scripts/check_includes.passed and their includers), about 1.6 CPU-seconds a file: near 1 s a file on
   2 idle cores (2026-12-01: 61 files took 191 s on 2 cores shared with other builds; the full sweep,
   .ci/nightly, 186 files in 666 s). The suite took over 8 minutes on 2 cores when include_test swept
   every file (276 s of it). ctest prints each test's time as it ends"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
phase "done"
