#!/usr/bin/env bash
# Stages the Debian packages fsdp.cpp builds against into .debs/, for the GPU
# machine, which has nvcc, CMake and PyTorch but no network and none of these
# -dev packages. Run here (it downloads from Debian's archive), then carry
# .debs to that machine; scripts/gpu_check.sh unpacks them there. The
# header-only cudnn-frontend (PyPI) goes beside them, in .debs/cudnn-frontend.
#   scripts/gpu_debs.sh && echo /.debs/ >> .git/info/exclude
#   scripts/gpu_debs.sh --list   prints, downloading nothing, "staged PACKAGE" for each package it
#                                stages and "device PACKAGE" for each it counts on the device having
set -euo pipefail
cd "$(dirname "$0")/.."
# The runtime libraries they need beyond what Ubuntu 24.04 with gcc 13 has: OpenBLAS's
# libgfortran5 (and its libquadmath0), Gloo's hiredis, ibverbs and libnl. scripts/gpu_check.sh
# unpacks only the packages that machine does not have installed, so that none of these
# replaces a newer copy of its own (libgomp1, libgcc-s1 and libstdc++6 are its own).
# Open MPI is not staged (its tree is large): the device has its own (the device tool's notes),
# and the check's build links it there; a prebuilt tree goes without the MPI backend.
staged=(libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev libgtest-dev googletest
  libtomlplusplus-dev libtomlplusplus3
  libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev libopenblas0 libgfortran5 libquadmath0
  libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200)
# What the device's image is counted on to have, by this machine's (Debian's) package names: the C
# and C++ runtimes of Ubuntu 24.04 with gcc 13, and Open MPI with what its libraries load.
# tests/gpu_layout_test.sh refuses a library the built programs load from any other package.
device=(libc6 libstdc++6 libgcc-s1 libgomp1 zlib1g libudev1
  libopenmpi3 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7)
if [ "${1:-}" = --list ]; then
  printf 'staged %s\n' "${staged[@]}"
  printf 'device %s\n' "${device[@]}"
  exit 0
fi
mkdir -p .debs
cd .debs
apt-get download -q "${staged[@]}" > /dev/null
ls -1 *.deb | wc -l | xargs printf '%s packages staged in .debs/\n'
cd ..
FSDP_BUILD_DIR=.debs/fe-build bash scripts/install-deps.sh > /dev/null
rm -rf .debs/cudnn-frontend && mv .debs/fe-build/_deps/cudnn-frontend .debs/cudnn-frontend && rm -rf .debs/fe-build
echo "cudnn-frontend $(cat .debs/cudnn-frontend/VERSION) staged in .debs/cudnn-frontend/include"
