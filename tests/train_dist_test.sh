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
mpi_run -np 2 "$bin" "${small[@]}" --batch 4 > "$work/mpi2.out" 2>&1 \
  || bad "mpirun -np 2 failed: $(tail -3 "$work/mpi2.out")"
"$fsdprun" --standalone --nproc_per_node 2 "$bin" "${small[@]}" --batch 4 > "$work/gloo2.out" 2>&1 \
  || bad "fsdprun 2 ranks failed: $(tail -3 "$work/gloo2.out")"
mpi_run -np 2 "$bin" "${small[@]}" --batch 2 --grad-accum 2 \
  --reshard-after-forward false > "$work/accum.out" 2>&1 || bad "grad-accum run failed: $(tail -3 "$work/accum.out")"
FSDP_DIST_DEVICE_CHECK=1 mpi_run -x FSDP_DIST_DEVICE_CHECK -np 2 \
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

# The llama family's options: grouped-query attention (2 heads over 1 kv head), head dim 16, q/k/v
# biases, rope theta 1e5 and the head tied to the embedding (one parameter, in the root's group).
# 2 ranks sharded and 2 ranks unsharded (DDP-style) give 1 rank's losses and gradient norms (the
# clipping counts the tied weight once), and a 2-rank resume from a checkpoint holding it is
# bit-exact (losses at full precision from --log-file).
G=(--preset tiny --arch llama --vocab 256 --dim 64 --layers 2 --heads 2 --kv-heads 1 --head-dim 16 --qkv-bias
  --tie-embeddings --rope-theta 100000 --seq 64 --steps 8 --lr 3e-3 --grad-clip 1.0 --data "$work/text.txt"
  --sample-tokens 0 --threads 1)
mpi=("${mpirun_local[@]}" -np 2)
jsonl() { python3 -c "import json,sys; [print(repr(json.loads(l)[sys.argv[2]])) for l in open(sys.argv[1]) if l.strip()]" "$1" "$2"; }
"$bin" "${G[@]}" --batch 8 --log-file "$work/g1.jsonl" > "$work/g1.out" 2>&1 || bad "gqa 1 rank failed: $(tail -3 "$work/g1.out")"
"${mpi[@]}" "$bin" "${G[@]}" --batch 4 --log-file "$work/g2.jsonl" > "$work/g2.out" 2>&1 \
  || bad "gqa 2 ranks failed: $(tail -3 "$work/g2.out")"
"${mpi[@]}" "$bin" "${G[@]}" --batch 4 --shard none --log-file "$work/gddp.jsonl" > "$work/gddp.out" 2>&1 \
  || bad "gqa 2 ranks --shard none failed: $(tail -3 "$work/gddp.out")"
"${mpi[@]}" "$bin" "${G[@]}" --batch 4 --steps 4 --ckpt-dir "$work/gck" --ckpt-every 4 > /dev/null 2>&1 \
  || bad "gqa 2-rank first half failed"
"${mpi[@]}" "$bin" "${G[@]}" --batch 4 --ckpt-dir "$work/gck" --resume --log-file "$work/gres.jsonl" \
  > "$work/gres.out" 2>&1 || bad "gqa 2-rank resume failed: $(tail -3 "$work/gres.out")"
grep -qE "kv heads / head dim +\| 1 / 16, tied head, qkv bias" "$work/g1.out" && ok \
  || bad "the run table does not show the llama options: $(grep 'kv heads' "$work/g1.out")"
for run in g2 gddp; do
  for key in loss grad_norm; do
    paste <(jsonl "$work/g1.jsonl" $key) <(jsonl "$work/$run.jsonl" $key) |
      awk '{d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * $1 + 1e-6) bad = 1; n++} END {exit (bad || n != 8)}' \
      && ok || bad "gqa $run ${key}s differ from 1 rank: $(paste -d' ' <(jsonl "$work/g1.jsonl" $key) <(jsonl "$work/$run.jsonl" $key) | tr '\n' ';')"
  done
done
[ "$(jsonl "$work/g2.jsonl" loss | tail -4)" = "$(jsonl "$work/gres.jsonl" loss)" ] && ok \
  || bad "gqa 2-rank resume is not bit-exact: $(jsonl "$work/g2.jsonl" loss | tail -4 | tr '\n' ' ') vs $(jsonl "$work/gres.jsonl" loss | tr '\n' ' ')"
python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['tensors']; sys.exit(not ('embed.weight' in t and 'head.weight' not in t))" \
  "$work/gck/step_00000004/metadata.json" && ok || bad "the tied checkpoint should hold embed.weight and no head.weight"

summary
