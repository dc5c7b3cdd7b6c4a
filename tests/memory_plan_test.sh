#!/usr/bin/env bash
# The memory plan against the measured peak: fsdp-train prints both in its summary line
# ("peak rss R MB | plan P MB resident (measured/plan X), A MB allocated (Y)"). Each run's
# measured peak resident set and the allocator's peak must lie within 10% of the plan, at the
# tiny preset (np 1 and 2, checkpointing none, full and every:2) and a 12-block, dim-512 model
# with the seed vocabulary (np 1, none and full). Peaks are byte counts, not times: the test does
# not depend on the machine's load.
set -uo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"

mpi=("${mpirun_local[@]}")

check() {  # check NAME COMMAND...
  local name=$1
  shift
  if ! "$@" > "$work/out" 2> "$work/err"; then
    bad "$name: fsdp-train failed: $(tail -3 "$work/err")"
    return
  fi
  local line
  line=$(grep '^summary |' "$work/out" | head -1)
  local r a
  r=$(sed -nE 's/.*plan [0-9.]+ MB resident \(measured\/plan ([0-9.]+)\).*/\1/p' <<< "$line")
  a=$(sed -nE 's/.*MB allocated \(([0-9.]+)\).*/\1/p' <<< "$line")
  if [ -z "$r" ] || [ -z "$a" ]; then
    bad "$name: no plan in the summary line: '$line'"
    return
  fi
  awk -v x="$r" 'BEGIN {exit !(x >= 0.9 && x <= 1.1)}' && ok ||
    bad "$name: measured/plan resident $r is outside [0.9, 1.1]: $line"
  awk -v x="$a" 'BEGIN {exit !(x >= 0.9 && x <= 1.1)}' && ok ||
    bad "$name: measured/plan allocated $a is outside [0.9, 1.1]: $line"
  echo "$name: $line"
}

tiny=(--preset tiny --steps 2 --threads 1)
for ac in none full every:2; do
  check "tiny np1 $ac" "$bin" "${tiny[@]}" --activation-checkpoint "$ac"
done
for ac in none full; do
  check "tiny np2 $ac" "${mpi[@]}" -np 2 "$bin" "${tiny[@]}" --activation-checkpoint "$ac"
done
wide=(--preset seed --dim 512 --heads 8 --layers 12 --batch 2 --seq 512 --steps 2 --threads 1)
for ac in none full; do
  check "L12 d512 vocab 32000 np1 $ac" "$bin" "${wide[@]}" --activation-checkpoint "$ac"
done

summary
