#!/usr/bin/env bash
# Stages the Debian packages fsdp.cpp builds against into .debs/, for the GPU
# machine, which has nvcc, CMake and PyTorch but no network and none of these
# -dev packages. Run here (it downloads from Debian's archive), then carry
# .debs to that machine; scripts/gpu_check.sh unpacks them there. The
# header-only cudnn-frontend (PyPI) goes beside them, in .debs/cudnn-frontend.
#   scripts/gpu_debs.sh && echo /.debs/ >> .git/info/exclude
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .debs
cd .debs
# The runtime libraries they need beyond what Ubuntu 24.04 with gcc 13 has: OpenBLAS's
# libgfortran5 (and its libquadmath0), Gloo's hiredis, ibverbs and libnl. scripts/gpu_check.sh
# unpacks only the packages that machine does not have installed, so that none of these
# replaces a newer copy of its own (libgomp1, libgcc-s1 and libstdc++6 are its own).
# Open MPI is not staged (its tree is large): that build goes without the MPI backend.
apt-get download -q libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev libgtest-dev googletest \
  libtomlplusplus-dev libtomlplusplus3 \
  libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev libopenblas0 libgfortran5 libquadmath0 \
  libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200 > /dev/null
ls -1 *.deb | wc -l | xargs printf '%s packages staged in .debs/\n'
cd ..
FSDP_BUILD_DIR=.debs/fe-build bash scripts/install-deps.sh > /dev/null
rm -rf .debs/cudnn-frontend && mv .debs/fe-build/_deps/cudnn-frontend .debs/cudnn-frontend && rm -rf .debs/fe-build
echo "cudnn-frontend $(cat .debs/cudnn-frontend/VERSION) staged in .debs/cudnn-frontend/include"
