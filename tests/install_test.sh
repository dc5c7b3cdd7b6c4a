#!/usr/bin/env bash
# Installs the built library into a temporary prefix, then configures, builds
# and runs tests/consumer against it with find_package(fsdp).
set -euo pipefail
build_dir=$1
consumer_src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
[ -n "$(find "$work/prefix" -name fsdpConfig.cmake)" ] || { echo "no fsdpConfig.cmake installed"; exit 1; }
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S "$consumer_src" -B "$work/build" "${gen[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log" \
  || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/build/consumer"
