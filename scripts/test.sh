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

phase "scripts/install_deps.sh: installs the Debian packages that are missing"
scripts/install_deps.sh
phase "scripts/build.sh: builds every target into $build (minutes from scratch, seconds when up to date)"
scripts/build.sh
count=$(ctest --test-dir "$build" -N | sed -n 's/^Total Tests: //p')
phase "ctest -j $(nproc): $count tests; on a 2-core machine the suite takes over 8 minutes (include_test,
   stub_build_test, readme_test, multinode_test and slurm_test are the long ones); ctest prints each
   test's time as it ends"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
phase "done"
