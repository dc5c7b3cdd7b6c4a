#!/usr/bin/env bash
# Stages the Debian packages fsdp.cpp builds against into .debs/, for the GPU
# machine, which has nvcc, CMake and PyTorch but no network and none of these
# -dev packages. Run here (it downloads from Debian's archive), then carry
# .debs to that machine; scripts/gpu_check.sh unpacks them there.
#   scripts/gpu-debs.sh && echo /.debs/ >> .git/info/exclude
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .debs
cd .debs
apt-get download -q libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev libgtest-dev googletest \
  libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev libopenblas0 > /dev/null
ls -1 *.deb | wc -l | xargs printf '%s packages staged in .debs/\n'
