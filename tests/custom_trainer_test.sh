#!/usr/bin/env bash
# examples/custom_trainer (a trainer from the library's parts and train_loop, fsdp-train's loop, in
# at most 40 lines) at 2 ranks: it prints the losses fsdp-train prints for the same config, its host
# waits once per step, and a run stopped at step 10 and restarted
# resumes bit for bit (the losses of steps 10-19 equal the uninterrupted run's, every digit). Its
# resume policy is fsdp-train's (the same checkpoint::Manager): an incomplete newest checkpoint is
# skipped aloud by both, and the newest complete one is loaded.
set -uo pipefail
trainer=$1
fsdp_train=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE FSDP_COLLECTIVE_TIMEOUT_S=120
mpi=("${mpirun_local[@]}" -np 2)
source_file="$(dirname "$0")/../examples/custom_trainer/main.cpp"
lines=$(wc -l < "$source_file")
[ "$lines" -le 40 ] && grep -q 'train::train_loop(' "$source_file" && ok \
  || bad "examples/custom_trainer/main.cpp is $lines lines (at most 40) or does not call train::train_loop"
losses() { grep -E '^step ' "$1" | sed -E 's/.*loss ([0-9.]+).*/\1/'; }
# A step line's numbers that do not depend on the machine's speed: step, loss, lr and grad norm.
numbers() { grep -E '^step ' "$1" | sed -E 's/^(step [0-9]+ \| loss [0-9.]+) .*(\| lr [^|]*\| grad norm [0-9.]+).*/\1 \2/'; }

"${mpi[@]}" "$trainer" "$work/a" > "$work/full.out" 2>&1 || bad "custom_trainer failed: $(tail -3 "$work/full.out")"
"${mpi[@]}" "$fsdp_train" --preset tiny --batch 4 --steps 20 --lr 1e-3 --weight-decay 0.01 \
  --warmup-steps 5 --lr-decay cosine --min-lr 0 --grad-clip 1.0 --seed 1 --threads 1 --sample-tokens 0 \
  > "$work/fsdp_train.out" 2>&1 || bad "fsdp-train failed: $(tail -3 "$work/fsdp_train.out")"
losses "$work/full.out" | awk '{printf "%.4f\n", $1}' > "$work/l_custom"
losses "$work/fsdp_train.out" > "$work/l_train"
[ "$(wc -l < "$work/l_custom")" -eq 20 ] && ok || bad "custom_trainer printed $(wc -l < "$work/l_custom") step lines"
cmp -s "$work/l_custom" "$work/l_train" && ok \
  || bad "custom_trainer and fsdp-train losses differ: $(paste -d' ' "$work/l_custom" "$work/l_train" | tr '\n' ';')"
[ "$(grep -cE '^step .*\| host syncs 1$' "$work/full.out")" -eq 20 ] && ok \
  || bad "custom_trainer's steps do not each wait for the device once: $(grep -oE 'host syncs [0-9-]+' "$work/full.out" | sort | uniq -c | tr '\n' ';')"

"${mpi[@]}" "$trainer" "$work/b" 10 > "$work/first.out" 2>&1 || bad "the run to step 10 failed"
[ -f "$work/b/step_00000010/metadata.json" ] && ok || bad "no checkpoint at step 10: $(ls "$work/b" 2>&1)"
"${mpi[@]}" "$trainer" "$work/b" > "$work/resumed.out" 2>&1 || bad "the resumed run failed: $(tail -3 "$work/resumed.out")"
numbers "$work/full.out" | grep -E '^step (1[0-9]) ' > "$work/tail_full"
numbers "$work/resumed.out" > "$work/tail_resumed"
[ "$(wc -l < "$work/tail_resumed")" -eq 10 ] && cmp -s "$work/tail_full" "$work/tail_resumed" && ok \
  || bad "the resumed steps differ from the uninterrupted run: $(diff "$work/tail_full" "$work/tail_resumed" | head -4 | tr '\n' ';')"

# An incomplete newest checkpoint (a step folder without metadata.json, an unfinished .tmp_ one)
# is skipped, aloud, by custom_trainer and by fsdp-train alike.
skipped() {  # skipped OUT DIR: both incomplete folders named as skipped
  grep -qF "resume: skipping $2/step_00000015: no metadata.json" "$1" \
    && grep -qF "resume: skipping $2/.tmp_step_00000012: an unfinished write" "$1"
}
"${mpi[@]}" "$trainer" "$work/c" 10 > /dev/null 2>&1 || bad "custom_trainer: the run to step 10 failed"
mkdir -p "$work/c/step_00000015" "$work/c/.tmp_step_00000012"
"${mpi[@]}" "$trainer" "$work/c" > "$work/c.out" 2>&1 || bad "custom_trainer: the resume failed: $(tail -3 "$work/c.out")"
skipped "$work/c.out" "$work/c" && [ "$(grep -m1 -E '^step ' "$work/c.out" | cut -d' ' -f2)" = 10 ] && ok \
  || bad "custom_trainer did not skip the incomplete checkpoints and resume at step 10: $(head -4 "$work/c.out" | tr '\n' ';')"
small=(--preset tiny --dim 32 --layers 1 --heads 4 --vocab 64 --seq 16 --batch 2 --threads 1 --sample-tokens 0)
"$fsdp_train" "${small[@]}" --steps 2 --ckpt-dir "$work/t" --ckpt-every 1 > /dev/null 2>&1 || bad "fsdp-train: the run to step 2 failed"
mkdir -p "$work/t/step_00000015" "$work/t/.tmp_step_00000012"
"$fsdp_train" "${small[@]}" --steps 3 --ckpt-dir "$work/t" --resume > "$work/t.out" 2>&1 \
  || bad "fsdp-train: the resume failed: $(tail -3 "$work/t.out")"
skipped "$work/t.out" "$work/t" && grep -qF "resume: loaded $work/t/step_00000002 (step 2)" "$work/t.out" && ok \
  || bad "fsdp-train did not skip the incomplete checkpoints and load step 2: $(grep resume: "$work/t.out" | tr '\n' ';')"
summary
