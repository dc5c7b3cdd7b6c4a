#!/usr/bin/env bash
# Installs the built library into a temporary prefix, then configures, builds
# and runs tests/consumer against it with find_package(fsdp); and runs the installed tools from
# the prefix (their RUNPATH finds the installed library): fsdp-train --help and a 2-step run.
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
for tool in fsdp-train fsdp-generate fsdp-export fsdp-tokenize; do
  [ -x "$work/prefix/bin/$tool" ] || continue
  "$work/prefix/bin/$tool" --help > "$work/help.out" 2>&1 \
    || { echo "installed $tool --help failed: $(tail -3 "$work/help.out")"; exit 1; }
done
if [ -x "$work/prefix/bin/fsdp-train" ]; then
  (cd "$work" && env -u LD_LIBRARY_PATH OMP_NUM_THREADS=1 "$work/prefix/bin/fsdp-train" --preset tiny --dim 32 \
    --layers 1 --heads 2 --seq 16 --batch 2 --steps 2 --threads 1 > "$work/train.out" 2>&1) \
    || { echo "installed fsdp-train failed: $(tail -3 "$work/train.out")"; exit 1; }
  grep -q '^step 1 ' "$work/train.out" || { echo "installed fsdp-train printed no step 1: $(tail -3 "$work/train.out")"; exit 1; }
  echo "installed tools run from $work/prefix/bin (RUNPATH $(readelf -d "$work/prefix/bin/fsdp-train" | sed -nE 's/.*R(UN)?PATH.*\[(.*)\]/\2/p'))"
fi
