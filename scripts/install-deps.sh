#!/usr/bin/env bash
# Installs fsdp.cpp's build dependencies from Debian's packages, by name.
# Idempotent, and silent when everything is already installed. The CUDA
# toolkit is not installed here: the build uses it from /usr/local/cuda when
# it is there, and builds CPU-only when it is not.
set -euo pipefail

packages=(
  cmake g++ ninja-build ccache pkg-config python3 iwyu
  libopenmpi-dev openmpi-bin libgloo-dev
  libfmt-dev nlohmann-json3-dev libcli11-dev libgtest-dev
  libopenblas-openmp-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo > /dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
