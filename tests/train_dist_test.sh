#!/usr/bin/env bash
# fsdp-train sharded: on text, 2 ranks under mpirun and under scripts/fsdprun
# give the losses of 1 rank with the same global batch, and the loss falls.
# The same holds in the shape of a CUDA world (FSDP_DIST_DEVICE_CHECK=1: a
# device half that, like NCCL, refuses host tensors), checkpoints included.
set -uo pipefail
bin=$1
fsdprun=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"
export OMP_WAIT_POLICY=PASSIVE FSDP_COLLECTIVE_TIMEOUT_S=120
cat /usr/share/common-licenses/* > "$work/text.txt" 2> /dev/null
small=(--preset tiny --arch llama --vocab 256 --dim 64 --layers 2 --heads 2 --seq 64 --steps 20 --lr 3e-3
  --data "$work/text.txt" --sample-tokens 0 --threads 1)
losses() { grep -E '^(\[rank0\]:)?step ' "$1" | sed -E 's/.*loss ([0-9.]+).*/\1/'; }

"$bin" "${small[@]}" --batch 8 > "$work/np1.out" 2>&1 || bad "1 rank failed: $(tail -3 "$work/np1.out")"
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$bin" "${small[@]}" --batch 4 > "$work/mpi2.out" 2>&1 \
  || bad "mpirun -np 2 failed: $(tail -3 "$work/mpi2.out")"
"$fsdprun" --standalone --nproc_per_node 2 "$bin" "${small[@]}" --batch 4 > "$work/gloo2.out" 2>&1 \
  || bad "fsdprun 2 ranks failed: $(tail -3 "$work/gloo2.out")"
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$bin" "${small[@]}" --batch 2 --grad-accum 2 \
  --reshard-after-forward false > "$work/accum.out" 2>&1 || bad "grad-accum run failed: $(tail -3 "$work/accum.out")"
FSDP_DIST_DEVICE_CHECK=1 mpirun --allow-run-as-root --oversubscribe --bind-to none -x FSDP_DIST_DEVICE_CHECK -np 2 \
  "$bin" "${small[@]}" --batch 4 --ckpt-dir "$work/ck" --ckpt-every 10 > "$work/devcheck.out" 2>&1 \
  || bad "device-check run failed: $(tail -3 "$work/devcheck.out")"

losses "$work/np1.out" > "$work/l1"
[ "$(wc -l < "$work/l1")" -eq 20 ] && ok || bad "1 rank printed $(wc -l < "$work/l1") step lines"
first=$(head -1 "$work/l1")
last5=$(tail -5 "$work/l1" | awk '{s += $1} END {print s / NR}')
awk -v f="$first" -v l="$last5" 'BEGIN {exit !(l < f - 1.0)}' && ok || bad "loss did not fall: $first -> $last5"
for run in mpi2 gloo2 accum devcheck; do
  losses "$work/$run.out" > "$work/l_$run"
  if [ "$(wc -l < "$work/l_$run")" -ne 20 ]; then
    bad "$run printed $(wc -l < "$work/l_$run") step lines"
    continue
  fi
  # Printed to 4 decimals; f32 reduction order may move the last digit.
  paste "$work/l1" "$work/l_$run" | awk '{d = $1 - $2; if (d < 0) d = -d; if (d > 2e-4 * $1 + 1e-4) bad = 1} END {exit bad}' \
    && ok || bad "$run losses differ from 1 rank: $(paste -d' ' "$work/l1" "$work/l_$run" | head -20 | tr '\n' ';')"
done
grep -q "world size             | 2 (mpi, mpirun)" "$work/mpi2.out" && ok || bad "mpi run did not report world size 2"
grep -q "world size             | 2 (gloo, torchrun)" "$work/gloo2.out" && ok || bad "gloo run did not report world size 2"
grep -q "world size             | 2 (mpi-device-check+mpi, mpirun)" "$work/devcheck.out" && ok \
  || bad "device-check run did not report its device + host world: $(grep 'world size' "$work/devcheck.out")"
[ -f "$work/ck/step_00000020/metadata.json" ] && ok || bad "device-check run wrote no checkpoint: $(ls "$work/ck" 2>&1)"

summary
