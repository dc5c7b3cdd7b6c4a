#!/usr/bin/env bash
# The layer table holds: scripts/check_layers.py passes on this checkout, and fails, naming the
# file, the line and both layers, on a copy with an upward #include planted (core including
# train) and on one with a folder the table does not list.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
check="$root/scripts/check_layers.py"
pass=0 fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

if python3 "$check" "$root"; then ok "the checkout's includes go down the table"; else bad "the checkout"; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
copy() { rm -rf "$tmp/t"; mkdir -p "$tmp/t/docs"; cp -r "$root/src" "$root/include" "$root/kernels" "$tmp/t/";
  cp "$root/docs/architecture.md" "$tmp/t/docs/"; }

copy
victim=src/core/tensor.cpp
line=$(( $(grep -n '^#include' "$tmp/t/$victim" | tail -1 | cut -d: -f1) + 1 ))
sed -i "${line}i #include \"fsdp/train/trainer.h\"" "$tmp/t/$victim"
if out=$(python3 "$check" "$tmp/t" 2>&1); then bad "a planted upward include passed"
elif grep -q "^$victim:$line: the core layer includes \"fsdp/train/trainer.h\" of the train layer" <<< "$out"; then
  ok "core including train is refused at $victim:$line"
else bad "the planted include's report: $out"; fi

copy
mkdir -p "$tmp/t/src/extras" && echo '#include "fsdp/core/tensor.h"' > "$tmp/t/src/extras/x.cpp"
if out=$(python3 "$check" "$tmp/t" 2>&1); then bad "an unlisted folder passed"
elif grep -q '^src/extras/: a layer the table in docs/architecture.md does not list' <<< "$out"; then
  ok "an unlisted folder src/extras/ is refused"
else bad "the unlisted folder's report: $out"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
