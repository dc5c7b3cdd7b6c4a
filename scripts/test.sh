#!/usr/bin/env bash
# The test command: installs missing dependencies, builds everything (the CUDA
# files too, when nvcc is found) and runs every test with ctest. GPU tests
# skip with "no CUDA device" on a machine without one.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}  # the tests' own builds (stub, install) too
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir "${FSDP_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
