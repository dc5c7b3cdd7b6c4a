#!/usr/bin/env bash
# Faults an operator's cluster brings, each with what the user must see (docs/reliability.md
# lists them all, with the test that holds each):
#   a stuck (SIGSTOPped) peer under mpirun and under fsdprun ends the job within the time-out
#   plus 30 s, naming the collective, its number and the late rank; two fsdprun jobs on one port:
#   the second is refused by name and the first finishes; SIGTERM stops training after the step
#   with a checkpoint and exit 0 (alone and under fsdprun), and --resume goes on from it; a
#   non-finite loss stops before the optimizer step and before any save; an out-of-memory --seq
#   is the library's error, not a crash; a .bin with a bad magic is refused; --resume never
#   guesses; outputs that cannot be written are refused before the first step; bad flags.
#   reliability_test.sh FSDP_TRAIN FSDPRUN
set -uo pipefail
train=$1
fsdprun=$2
work=$(mktemp -d)
trap 'pkill -9 -f "$work" 2> /dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
small=(--preset tiny --dim 32 --layers 1 --heads 4 --vocab 64 --seq 16 --batch 2 --threads 1)
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
refused() {  # refused NAME NEEDLE command...: exits non-zero and says NEEDLE
  local name=$1 needle=$2
  shift 2
  if "$@" > "$work/refused.out" 2>&1; then bad "$name: succeeded"
  elif ! grep -qF -- "$needle" "$work/refused.out"; then bad "$name: no '$needle' in: $(tail -3 "$work/refused.out")"
  else ok; fi
}
# stuck NAME LAUNCHER...: a 2-rank run whose rank 1 is stopped after 5 s must end within 8 + 30 s
# and name the collective, its number and rank 1.
stuck() {
  local name=$1
  shift
  FSDP_COLLECTIVE_TIMEOUT_S=8 timeout 90 "$@" "$train" --preset tiny --seq 32 --steps 100000 \
    --log-file "$work/$name.jsonl" > "$work/$name.out" 2>&1 &
  local job=$! pid="" t0 p
  for _ in $(seq 100); do  # rank 1 of this run, by its launcher's environment
    for p in $(pgrep -f -- "^$train .*$work/$name.jsonl"); do
      tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qE '^(OMPI_COMM_WORLD_RANK|RANK)=1$' && pid=$p
    done
    [ -n "$pid" ] && [ -s "$work/$name.jsonl" ] && break
    sleep 0.1
  done
  sleep 2
  [ -n "$pid" ] && kill -STOP "$pid"
  t0=$(date +%s)
  wait $job
  local rc=$? took=$(($(date +%s) - t0))
  [ -n "$pid" ] && kill -9 "$pid" 2> /dev/null
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 38 ] \
    && grep -qE 'collective #[0-9]+ of group' "$work/$name.out" && grep -qE 'late: rank 1 ' "$work/$name.out" \
    && ok || bad "stuck peer under $name: rc $rc after $took s: $(grep -m1 -iE 'error|late' "$work/$name.out" | cut -c1-300)"
}

# 1. A stuck peer.
stuck mpirun "${mpi[@]}" -np 2
stuck fsdprun python3 "$fsdprun" --standalone --nproc_per_node 2

# 2. Two jobs on one port: the second is refused by name, the first is undisturbed. The first is
# held running (a step count it never reaches) until the second has been refused, then stopped
# with SIGTERM: the outcome never depends on how fast this machine runs its steps.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 "$fsdprun" --nproc_per_node 2 --master_port "$port" "$train" "${small[@]}" --steps 100000 \
  --log-file "$work/first.jsonl" > "$work/first.out" 2>&1 &
first=$!
for _ in $(seq 600); do [ -s "$work/first.jsonl" ] && break; sleep 0.1; done
python3 "$fsdprun" --nproc_per_node 2 --master_port "$port" "$train" "${small[@]}" --steps 5 \
  > "$work/second.out" 2>&1
second_rc=$?
lines=$(wc -l < "$work/first.jsonl")
for _ in $(seq 600); do [ "$(wc -l < "$work/first.jsonl")" -gt "$lines" ] && break; sleep 0.1; done
after=$(wc -l < "$work/first.jsonl")
kill -TERM $first
wait $first
first_rc=$?
[ $first_rc -eq 0 ] && [ "$after" -gt "$lines" ] && grep -q 'SIGTERM received: stopped after step' "$work/first.out" && ok \
  || bad "the first job was disturbed: rc $first_rc, $lines steps at the refusal, $after after: $(grep -m2 error "$work/first.out")"
[ $second_rc -ne 0 ] && grep -qE 'belongs to run|cannot serve on port' "$work/second.out" && ok \
  || bad "the second job was not refused by name: rc $second_rc: $(grep -m2 error "$work/second.out")"

# 3. SIGTERM: the step ends, a checkpoint is written, exit 0; --resume goes on from it.
"$train" "${small[@]}" --steps 100000 --ckpt-dir "$work/term" --ckpt-every 1000 --log-file "$work/term.jsonl" \
  > "$work/term.out" 2>&1 &
job=$!
for _ in $(seq 100); do [ -s "$work/term.jsonl" ] && break; sleep 0.1; done
kill -TERM $job
wait $job
rc=$?
n=$(wc -l < "$work/term.jsonl")
[ $rc -eq 0 ] && grep -q "SIGTERM received: stopped after step $((n - 1))" "$work/term.out" \
  && [ -f "$work/term/step_$(printf %08d "$n")/metadata.json" ] && ok \
  || bad "SIGTERM: rc $rc after $n steps: $(tail -2 "$work/term.out")"
"$train" "${small[@]}" --steps $((n + 2)) --ckpt-dir "$work/term" --resume > "$work/term2.out" 2>&1 \
  && grep -q "resume: loaded .*(step $n)" "$work/term2.out" && grep -q "^step $((n + 1)) " "$work/term2.out" \
  && ok || bad "resume after SIGTERM: $(tail -2 "$work/term2.out")"
python3 "$fsdprun" --standalone --nproc_per_node 2 "$train" "${small[@]}" --steps 100000 --ckpt-dir "$work/term3" \
  --log-file "$work/term3.jsonl" > "$work/term3.out" 2>&1 &
job=$!
for _ in $(seq 100); do [ -s "$work/term3.jsonl" ] && break; sleep 0.1; done
kill -TERM $job
wait $job
rc=$?
[ $rc -eq 0 ] && grep -q "all of them stopped cleanly" "$work/term3.out" && ls "$work/term3" | grep -q step_ \
  && ok || bad "SIGTERM under fsdprun: rc $rc: $(tail -3 "$work/term3.out")"

# 4. A diverging run stops before the optimizer step: no checkpoint of the bad weights.
refused "non-finite loss" "before the optimizer step" "$train" "${small[@]}" --steps 6 --lr 1e12 \
  --ckpt-dir "$work/nan" --ckpt-every 1
[ -d "$work/nan/step_00000001" ] && [ ! -d "$work/nan/step_00000002" ] && ok \
  || bad "non-finite: checkpoints $(ls "$work/nan" | tr '\n' ' ')"

# 5. Out of memory is the library's error, not a crash.
refused "out of memory" "out of memory allocating" bash -c "ulimit -v 3000000; exec '$train' --seq 3000000 --batch 1 --steps 1 --threads 1"
grep -q terminate "$work/refused.out" && bad "out of memory: terminate in $(tail -2 "$work/refused.out")" || ok

# 6. A .bin file is an llm.c shard by its name: a bad magic is refused, not read as bytes.
head -c 4096 /dev/urandom > "$work/bad.bin"
refused "bad-magic .bin" "expected 20240520" "$train" "${small[@]}" --vocab 256 --steps 1 --data "$work/bad.bin"

# 7. --resume never guesses.
"$train" "${small[@]}" --steps 2 --ckpt-dir "$work/r" --ckpt-every 1 > /dev/null 2>&1 || bad "resume setup"
mkdir -p "$work/r/step_00000009"  # a newer, unfinished one
"$train" "${small[@]}" --steps 3 --ckpt-dir "$work/r" --resume > "$work/r.out" 2>&1 \
  && grep -q "skipping .*step_00000009: no metadata.json" "$work/r.out" && grep -q "(step 2)" "$work/r.out" \
  && ok || bad "incomplete newest checkpoint: $(tail -3 "$work/r.out")"
mkdir -p "$work/r2/step_00000004"
refused "only incomplete checkpoints" "none is complete" "$train" "${small[@]}" --steps 3 --ckpt-dir "$work/r2" --resume
[ -d "$work/r2/step_00000004" ] && ok || bad "the incomplete checkpoint was removed"
cp -r "$work/r/step_00000002" "$work/r3" && mkdir -p "$work/r3d" && mv "$work/r3" "$work/r3d/step_00000002"
echo '{"format": "fsdp.cpp-checkpoint/1", "shards": "x"}' > "$work/r3d/step_00000002/metadata.json"
refused "malformed metadata" "r3d/step_00000002/metadata.json" "$train" "${small[@]}" --steps 3 --ckpt-dir "$work/r3d" --resume
refused "resume with another --seq" "saved with seq 16 but this run has seq 32" \
  "$train" "${small[@]}" --seq 32 --steps 3 --ckpt-dir "$work/r" --resume
"$train" "${small[@]}" --steps 2 --ckpt-dir "$work/r" --resume > "$work/r4.out" 2>&1 \
  && grep -q "nothing left to train" "$work/r4.out" && ok || bad "resume at --steps: no warning"

# 8. Outputs are checked before the first step, naming the reason.
touch "$work/afile"
refused "unwritable --ckpt-dir" "--ckpt-dir '$work/afile/ck' cannot be created" \
  "$train" "${small[@]}" --steps 1 --ckpt-dir "$work/afile/ck"
grep -q '^step ' "$work/refused.out" && bad "--ckpt-dir checked only after a step" || ok
refused "unwritable --profile-dir" "--profile-dir '$work/afile/p' cannot be created" \
  "$train" "${small[@]}" --steps 3 --profile-steps 1:2 --profile-dir "$work/afile/p"
refused "unwritable --log-file" "Is a directory" "$train" "${small[@]}" --steps 1 --log-file "$work"

# 9. Flags that make no sense are refused by name.
refused "--eval-batches 0" "--eval-batches must be >= 1" "$train" "${small[@]}" --eval-every 1 --eval-batches 0
refused "--temperature -1" "--temperature must be >= 0" "$train" "${small[@]}" --temperature -1
refused "--min-lr above --lr" "--min-lr 0.01 is above --lr" "$train" "${small[@]}" --lr 1e-3 --min-lr 1e-2
refused "--decay-steps -1" "--decay-steps must be >= 0" "$train" "${small[@]}" --decay-steps -1
refused "--weight-decay -1" "--weight-decay must be >= 0" "$train" "${small[@]}" --weight-decay -1
refused "--hsdp -1" "--hsdp must be >= 0" "$train" "${small[@]}" --hsdp -1
refused "--eps 0" "--eps must be > 0" "$train" "${small[@]}" --eps 0
summary
