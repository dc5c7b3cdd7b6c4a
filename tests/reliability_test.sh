#!/usr/bin/env bash
# Faults an operator's cluster brings, each with what the user must see (docs/reliability.md
# lists them all, with the test that holds each):
#   a stuck (SIGSTOPped) peer under mpirun and under fsdprun ends the job within the time-out
#   plus 30 s, naming the collective, its number and the late rank; two fsdprun jobs on one port:
#   the second is refused by name and the first finishes; SIGTERM stops training after the step
#   with a checkpoint and exit 0 (alone and under fsdprun), and --resume goes on from it; a
#   non-finite loss stops before the optimizer step and before any save; an out-of-memory --seq
#   is the library's error, not a crash; a .bin with a bad magic is refused; --resume never
#   guesses; outputs that cannot be written are refused before the first step; bad flags; one job
#   and one run per --ckpt-dir (a second job and a fresh run refused by name, --overwrite, the
#   lock released by kill -9); a flood on the store's port leaves rank 0's memory and the job's
#   losses as they were.
#   reliability_test.sh FSDP_TRAIN FSDPRUN
set -uo pipefail
train=$1
fsdprun=$2
work=$(mktemp -d)
trap 'pkill -9 -f "$work" 2> /dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
small=(--preset tiny --dim 32 --layers 1 --heads 4 --vocab 64 --seq 16 --batch 2 --threads 1)
mpi=("${mpirun_local[@]}")
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
[ $second_rc -ne 0 ] && grep -qE 'belongs to (another )?run|cannot serve on port' "$work/second.out" && ok \
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

# 5. Out of memory is the library's error, not a crash: the memory plan refuses the run before
# any activation exists (its 265 GB predicted peak is more than any CI host has); past the plan
# (--allow-oversubscribe-memory) the allocator's own error.
refused "memory plan" "at the predicted peak of a step" "$train" --seq 3000000 --batch 1 --steps 1 --threads 1
refused "out of memory" "out of memory allocating" bash -c "ulimit -v 3000000; exec '$train' --seq 3000000 --batch 1 --steps 1 --threads 1 --allow-oversubscribe-memory"
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
# (format 1, which has no complete.json to check first: the parser itself refuses it)
rm "$work/r3d/step_00000002/complete.json"
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

# 10. A full disk (real small tmpfs mounts in a private mount namespace): a --log-file that cannot
# be written stops the run with errno's words; fsdp-export writes every file whole or fails naming
# errno, leaving no temporary (tests/full_disk.sh).
if unshare -m true 2> /dev/null; then
  unshare -m bash "$(dirname "$0")/full_disk.sh" "$train" "$(dirname "$train")/fsdp-export" "$work" \
    > "$work/full_disk.out" 2>&1 && ok || bad "full disk: $(grep FAIL "$work/full_disk.out" | head -5)"
else
  echo "SKIP: full disk (unshare -m is not allowed here)"
fi

# 11. Every FSDP_* value is checked at start, naming the variable (nan hung rank 0's store, 0 hung
# rank 1, abc terminated with rc 134 or was refused only at the first checkpoint).
for kv in FSDP_STORE_TIMEOUT_S=nan FSDP_STORE_TIMEOUT_S=inf FSDP_STORE_TIMEOUT_S=1e30 \
  FSDP_COLLECTIVE_TIMEOUT_S=0 FSDP_COLLECTIVE_TIMEOUT_S=-1 FSDP_COLLECTIVE_TIMEOUT_S=nan \
  FSDP_CPU_CACHE_MB=abc FSDP_CKPT_SLOW_WRITE_MS=abc FSDP_DIST_CHECK=2 FSDP_GEMM_PEAK_GFLOPS=-5; do
  refused "$kv" "[env] ${kv%%=*}='${kv#*=}' is not valid: expected" \
    env "$kv" timeout -k 10 60 "$train" "${small[@]}" --steps 2 --ckpt-dir "$work/envck" --ckpt-every 1
  grep -q '^step ' "$work/refused.out" && bad "$kv: refused only after a step" || ok
done
refused "FSDP_COLLECTIVE_TIMEOUT_S=0 at 2 ranks" "FSDP_COLLECTIVE_TIMEOUT_S='0' is not valid" \
  env FSDP_COLLECTIVE_TIMEOUT_S=0 timeout -k 10 60 python3 "$fsdprun" --standalone --nproc_per_node 2 \
  "$train" "${small[@]}" --steps 2

# 12. Data paths are regular files or directories: a device or a FIFO is refused by name (--data
# /dev/zero read forever while memory grew).
mkfifo "$work/fifo"
refused "--data /dev/zero" "'/dev/zero' is a character device; expected a regular file" \
  timeout -k 10 60 "$train" "${small[@]}" --vocab 256 --steps 1 --data /dev/zero
refused "--data FIFO" "is a FIFO (named pipe); expected a regular file" \
  timeout -k 10 60 "$train" "${small[@]}" --vocab 256 --steps 1 --data "$work/fifo"
refused "--data FIFO.bin" "is a FIFO (named pipe); expected a regular file" \
  bash -c "mkfifo '$work/f.bin' && exec timeout -k 10 60 '$train' ${small[*]} --vocab 256 --steps 1 --data '$work/f.bin'"

# 13. The summary's step time is the mean of the steps it timed (every step after the first, or the
# one step of a resume): it divided by --steps - 1.
summary_ok() {  # summary_ok OUT JSONL SKIP: the summary's ms against the mean step_ms after SKIP lines
  python3 - "$@" << 'PY'
import json, re, sys
out, log, skip = sys.argv[1], sys.argv[2], int(sys.argv[3])
ms = [json.loads(l)["step_ms"] for l in open(log) if l.strip()][skip:]
got = float(re.search(r"summary \| step ([0-9.]+) ms", open(out).read()).group(1))
want = sum(ms) / len(ms)
sys.exit(0 if abs(got - want) <= 0.06 + 0.01 * want else f"summary {got} ms, the timed steps' mean {want:.2f} ms")
PY
}
"$train" "${small[@]}" --steps 100000 --log-file "$work/sum.jsonl" > "$work/sum.out" 2>&1 &
job=$!
for _ in $(seq 600); do [ "$(wc -l 2> /dev/null < "$work/sum.jsonl" || echo 0)" -ge 3 ] && break; sleep 0.1; done
kill -TERM $job
wait $job
summary_ok "$work/sum.out" "$work/sum.jsonl" 1 2>> "$work/sum.out" && ok || bad "summary after SIGTERM: $(tail -2 "$work/sum.out")"
"$train" "${small[@]}" --steps 4 --ckpt-dir "$work/sumck" --ckpt-every 4 > /dev/null 2>&1 || bad "summary: setup"
"$train" "${small[@]}" --steps 5 --ckpt-dir "$work/sumck" --resume --log-file "$work/sum2.jsonl" > "$work/sum2.out" 2>&1 \
  && summary_ok "$work/sum2.out" "$work/sum2.jsonl" 0 2>> "$work/sum2.out" && ok \
  || bad "summary after a resume: $(tail -2 "$work/sum2.out")"

# 14. Launchers and signals.
# kill -9 of fsdprun ends its ranks (they start in their own sessions and were left running).
python3 "$fsdprun" --standalone --nproc_per_node 2 "$train" "${small[@]}" --steps 100000 \
  --log-file "$work/orphan.jsonl" > "$work/orphan.out" 2>&1 &
job=$!
for _ in $(seq 600); do [ -s "$work/orphan.jsonl" ] && break; sleep 0.1; done
kill -9 $job
wait $job 2> /dev/null
for _ in $(seq 100); do pgrep -f -- "$work/orphan.jsonl" > /dev/null || break; sleep 0.1; done
pgrep -f -- "$work/orphan.jsonl" > /dev/null && bad "kill -9 of fsdprun left its ranks running" || ok
# SIGTERM ends a wait in the rendezvous (rank 1 never comes) at once, not after FSDP_STORE_TIMEOUT_S.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port FSDP_STORE_TIMEOUT_S=300 \
  timeout -k 10 60 "$train" "${small[@]}" --steps 3 --log-file "$work/rdzv_term.jsonl" > "$work/rdzv_term.out" 2>&1 &
job=$!
for _ in $(seq 300); do python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2> /dev/null && break; sleep 0.1; done
kill -TERM $(pgrep -f -- "^$train .*$work/rdzv_term.jsonl")  # the rank itself (timeout signals twice)
wait $job
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "SIGTERM received: gave up waiting for the rendezvous store" "$work/rdzv_term.out" \
  && ok || bad "SIGTERM in the rendezvous: rc $rc: $(tail -2 "$work/rdzv_term.out")"
# SIGTERM ends a collective wait stuck on a stopped peer, not after FSDP_COLLECTIVE_TIMEOUT_S (300).
FSDP_COLLECTIVE_TIMEOUT_S=300 timeout -k 10 120 python3 "$fsdprun" --standalone --nproc_per_node 2 --grace 1 \
  "$train" "${small[@]}" --steps 100000 --log-file "$work/cterm.jsonl" > "$work/cterm.out" 2>&1 &
job=$!
r0="" r1=""
for _ in $(seq 600); do
  for p in $(pgrep -f -- "^$train .*$work/cterm.jsonl"); do
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx 'RANK=1' && r1=$p
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx 'RANK=0' && r0=$p
  done
  [ -n "$r0" ] && [ -n "$r1" ] && [ -s "$work/cterm.jsonl" ] && break
  sleep 0.1
done
kill -STOP "$r1"
lines=$(wc -l < "$work/cterm.jsonl")  # rank 0 is held in a collective once the log stops growing
for _ in $(seq 100); do sleep 0.2; n=$(wc -l < "$work/cterm.jsonl"); [ "$n" = "$lines" ] && break; lines=$n; done
kill -TERM "$r0"
wait $job
rc=$?
kill -9 "$r1" 2> /dev/null
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "SIGTERM received: gave up waiting for" "$work/cterm.out" \
  && ok || bad "SIGTERM in a stuck collective: rc $rc: $(grep -m2 -E 'error|SIGTERM' "$work/cterm.out")"
# An unresolvable MASTER_ADDR is an error at once, not after the store's time-out.
refused "unresolvable MASTER_ADDR" "no-such-host.invalid:29555) does not resolve" env RANK=1 WORLD_SIZE=2 \
  LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid MASTER_PORT=29555 FSDP_STORE_TIMEOUT_S=300 \
  timeout -k 10 60 "$train" "${small[@]}" --steps 1
# Two processes with RANK=1: the second is named, not run.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
launch_rank() {  # launch_rank RANK OUT: one rank of a 2-rank world on $port, held by --steps 100000
  RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    FSDP_RUN_ID=dup timeout -k 10 120 "$train" "${small[@]}" --steps 100000 --log-file "$work/dup.jsonl" > "$work/dup$2.out" 2>&1
}
launch_rank 0 a &
a=$!
launch_rank 1 b &
b=$!
for _ in $(seq 600); do [ -s "$work/dup.jsonl" ] && break; sleep 0.1; done
launch_rank 1 c
rc=$?
kill -TERM $(pgrep -f -- "^$train .*$work/dup.jsonl") 2> /dev/null
wait $a $b
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "RANK=1 is already taken" "$work/dupc.out" && ok \
  || bad "a second rank 1: rc $rc: $(tail -2 "$work/dupc.out")"
# Ranks started with different arguments are refused, naming the argument (--lr, --data ran).
cp /usr/share/common-licenses/GPL-3 "$work/a.txt" && cp /usr/share/common-licenses/GPL-2 "$work/b.txt"
refused "different --lr over the ranks" "differ from rank 0 in --lr" timeout -k 10 120 python3 "$fsdprun" \
  --standalone --nproc_per_node 2 bash -c 'exec "$0" "$@" --lr $((RANK + 1))e-3' "$train" "${small[@]}" --steps 2
grep -qF "this rank, 1, has --lr '0.002'" "$work/refused.out" && ok || bad "different --lr: this rank's value not named"
refused "different --data over the ranks" "differ from rank 0 in --data" timeout -k 10 120 python3 "$fsdprun" \
  --standalone --nproc_per_node 2 bash -c 'exec "$0" "$@" --data "'"$work"'/$([ $RANK = 0 ] && echo a || echo b).txt"' \
  "$train" "${small[@]}" --vocab 256 --steps 2

# 16. The data position is the windows read, not a batch index: at --lr 0 (the weights never
# change), 2 steps of --batch 2 then a resume at --batch 4 (1 rank) or --batch 2 (2 ranks) trains
# on windows 4..7, as the second step of a straight --batch 4 run does: the same loss and gradient
# norm. (As a batch index it read windows 8..11, and 4..7 were never trained on.) The data is named
# by content: the same path with new text is refused, a byte-identical copy elsewhere resumes.
cp /usr/share/common-licenses/GPL-3 "$work/d.txt"
dp=(--preset tiny --dim 32 --layers 1 --heads 4 --vocab 256 --seq 16 --threads 1 --lr 0 --data "$work/d.txt")
norm() { grep -oE "^step $2 \| loss [0-9.]+" "$1" | sed 's/^step [0-9]* //'; grep -oE "^step $2 .*grad norm [0-9.]+" "$1" | grep -oE "grad norm [0-9.]+$"; }
"$train" "${dp[@]}" --batch 4 --steps 2 > "$work/dp_straight.out" 2>&1 || bad "data position: straight run failed"
"$train" "${dp[@]}" --batch 2 --steps 2 --ckpt-dir "$work/dp" --ckpt-every 2 > /dev/null 2>&1 || bad "data position: setup failed"
cp -r "$work/dp" "$work/dp2"
"$train" "${dp[@]}" --batch 4 --steps 3 --ckpt-dir "$work/dp" --resume > "$work/dp_b4.out" 2>&1 || bad "data position: resume at --batch 4 failed"
"${mpi[@]}" -np 2 "$train" "${dp[@]}" --batch 2 --steps 3 --ckpt-dir "$work/dp2" --resume > "$work/dp_np2.out" 2>&1 \
  || bad "data position: resume at 2 ranks failed: $(tail -3 "$work/dp_np2.out")"
want=$(norm "$work/dp_straight.out" 1)
[ -n "$want" ] && [ "$(norm "$work/dp_b4.out" 2)" = "$want" ] && ok \
  || bad "resume at --batch 4 did not train on the next unread windows: '$(norm "$work/dp_b4.out" 2)' against '$want'"
[ -n "$want" ] && [ "$(norm "$work/dp_np2.out" 2)" = "$want" ] && ok \
  || bad "resume at 2 ranks did not train on the next unread windows: '$(norm "$work/dp_np2.out" 2)' against '$want'"
grep -q "4 windows (64 tokens) read, continuing at window 4" "$work/dp_b4.out" && ok \
  || bad "the resume does not say where the data goes on: $(grep resume: "$work/dp_b4.out")"
cp "$work/d.txt" "$work/d_copy.txt"
"$train" "${dp[@]}" --batch 4 --steps 4 --ckpt-dir "$work/dp" --resume --data "$work/d_copy.txt" > "$work/dp_copy.out" 2>&1 \
  && grep -q "resume: loaded .*dp/step_" "$work/dp_copy.out" && ok || bad "a byte-identical copy of the data was refused: $(tail -2 "$work/dp_copy.out")"
cp /usr/share/common-licenses/LGPL-3 "$work/d.txt"
refused "resume on new contents at the same path" "was trained on other data" \
  "$train" "${dp[@]}" --batch 4 --steps 5 --ckpt-dir "$work/dp" --resume

# 21. A checkpoint proves itself (issue 23): metadata.json is sealed by complete.json (its
# checksum), the chunks must cover every tensor exactly, the shard files present must be exactly
# 'shards' of them, and each shard's header names its shard, rank, world size, run and step.
# Every tamper below is refused by --resume (2 ranks) and by fsdp-export in the same words; each
# used to resume silently with a wrong loss, or export zeros. "resealed": complete.json rewritten
# for the edited metadata.json, as a careful forger would.
export_bin=$(dirname "$train")/fsdp-export
"${mpi[@]}" -np 2 "$train" "${small[@]}" --steps 2 --ckpt-every 1 --ckpt-dir "$work/seal" > "$work/seal.out" 2>&1 \
  && [ -f "$work/seal/step_00000002/complete.json" ] && ok || bad "seal setup: $(tail -3 "$work/seal.out")"
run=$(sed -nE 's/.*"run_id": "([^"]+)".*/\1/p' "$work/seal/step_00000002/complete.json")
"${mpi[@]}" -np 2 "$train" "${small[@]}" --steps 3 --ckpt-every 1 --ckpt-dir "$work/seal" --resume > "$work/seal_r.out" 2>&1 \
  && [ -n "$run" ] && grep -q "resume: loaded .*step_00000002 (step 2) of run $run;" "$work/seal_r.out" \
  && grep -q "\"run_id\": \"$run\"" "$work/seal/step_00000003/metadata.json" && ok \
  || bad "a resume names the run it loads and keeps its id: run '$run': $(grep resume: "$work/seal_r.out")"
# tamper NAME PYTHON [reseal]: a copy of step 2 in $work/tamper_NAME, PYTHON run on it with m
# (metadata.json's JSON, written back) and d (the folder).
tamper() {
  rm -rf "$work/tamper_$1" && mkdir -p "$work/tamper_$1" && cp -r "$work/seal/step_00000002" "$work/tamper_$1/"
  python3 "$(dirname "$0")/edit_metadata.py" "$work/tamper_$1/step_00000002" "$2" "${3:-}"
}
# both NAME NEEDLE: --resume and fsdp-export of $work/tamper_NAME refuse, saying NEEDLE.
both() {
  refused "$1: --resume" "$2" "${mpi[@]}" -np 2 "$train" "${small[@]}" --steps 3 --ckpt-dir "$work/tamper_$1" --resume
  refused "$1: fsdp-export" "$2" "$export_bin" --ckpt "$work/tamper_$1/step_00000002" --out "$work/tamper.safetensors"
}
tamper shards 'm["shards"] = 1' reseal
both shards "'embed.weight' has [[0,32],[32,32]] chunks but 'shards' is 1; expected one chunk per shard"
tamper gap 'm["tensors"]["head.weight"]["chunks"] = [[0, 32], [32, 20]]' reseal
both gap "'head.weight' chunks [[0,32],[32,20]] cover rows 0..52 but the tensor has 64 rows"
tamper negative 'm["tensors"]["head.weight"]["chunks"] = [[0, 32], [-5, 32]]' reseal
both negative "'head.weight' chunk 1 is [-5, 32]: a negative first row"
tamper overlap 'm["tensors"]["head.weight"]["chunks"] = [[0, 32], [16, 48]]' reseal
both overlap "'head.weight' chunk 1 is [16, 48]: it starts at row 16 but the chunks before it end at row 32 (an overlap: rows 16..31)"
tamper swapped '
os.rename(f"{d}/shard_00000.safetensors", f"{d}/x")
os.rename(f"{d}/shard_00001.safetensors", f"{d}/shard_00000.safetensors")
os.rename(f"{d}/x", f"{d}/shard_00001.safetensors")
f = m["files"]
f["shard_00000.safetensors"], f["shard_00001.safetensors"] = f["shard_00001.safetensors"], f["shard_00000.safetensors"]' reseal
both swapped "shard_00000.safetensors holds shard 1 (written by rank 1 of run '$run'), not shard 0: the shard files were swapped or renamed (shard 1's file is shard_00001.safetensors)"
tamper edited 'm["tensors"]["head.weight"]["chunks"] = [[0, 32], [32, 20]]'
both edited "step_00000002: metadata.json has checksum"
grep -qF "(metadata.json was changed after the checkpoint was written)" "$work/refused.out" && ok \
  || bad "an edited metadata.json: $(tail -1 "$work/refused.out")"
tamper norecord 'os.remove(f"{d}/complete.json")'
both norecord "step_00000002: no complete.json (an unfinished checkpoint, or its record was removed)"
tamper garbled 'open(f"{d}/complete.json", "w").write("{\"metadata_checksum\": 12")'
both garbled "step_00000002: complete.json is not a complete record (garbled)"
# With an older, intact checkpoint beside it, a resume skips the damaged one aloud (and saves
# nothing: --ckpt-every 0 over the run's own 1, so that the export below sees the same folder).
cp -r "$work/seal/step_00000001" "$work/tamper_edited/"
"${mpi[@]}" -np 2 "$train" "${small[@]}" --steps 3 --ckpt-dir "$work/tamper_edited" --resume --ckpt-every 0 > "$work/skip.out" 2>&1 \
  && grep -q "skipping .*tamper_edited/step_00000002" "$work/skip.out" && grep -q "step_00000001 (step 1) of run $run;" "$work/skip.out" \
  && ok || bad "a resume beside a damaged newer checkpoint: $(grep -E 'resume|error' "$work/skip.out" | head -3)"
"$export_bin" --ckpt "$work/tamper_edited" --out "$work/skip.safetensors" > "$work/skip_export.out" 2>&1 \
  && grep -q "export: skipping .*tamper_edited/step_00000002: metadata.json has checksum" "$work/skip_export.out" \
  && grep -q "export: reading .*tamper_edited/step_00000001" "$work/skip_export.out" \
  && ok || bad "an export of a folder beside a damaged newer checkpoint: $(tail -3 "$work/skip_export.out")"
# 'shards' and every chunk edited to agree, resealed: the second shard file is still there.
tamper shards1 'm["shards"] = 1
for t in m["tensors"].values(): t["chunks"] = [[0, t["shape"][0]]]' reseal
both shards1 "holds shard_00001.safetensors, which is not one of the 1 shard(s) metadata.json's 'shards' names"
# A checkpoint from before the seal (format 1: no complete.json, no run or rank in the shards'
# headers) is read, and the resume says so; a new one made to look old is refused by its shards.
tamper downgrade 'os.remove(f"{d}/complete.json"); m["format"] = "fsdp.cpp-checkpoint/1"'
both downgrade "names run '$run' but $work/tamper_downgrade/step_00000002/metadata.json is of format 1, which names none"
tamper old '
import struct
os.remove(f"{d}/complete.json")
m["format"] = "fsdp.cpp-checkpoint/1"
for k in ("run_id", "world_size"): del m[k]
for s in (0, 1):
    p = f"{d}/shard_{s:05d}.safetensors"
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h["__metadata__"] = {"shard": str(s)}
    t = json.dumps(h).encode()
    t += b" " * (-len(t) % 8)
    b = struct.pack("<Q", len(t)) + t + b[8 + n:]
    open(p, "wb").write(b)
    c = 0xcbf29ce484222325
    for x in b:
        c = ((c ^ x) * 0x100000001b3) % (1 << 64)
    m["files"][f"shard_{s:05d}.safetensors"]["checksum"] = f"{c:016x}"'
"${mpi[@]}" -np 2 "$train" "${small[@]}" --steps 3 --ckpt-dir "$work/tamper_old" --resume > "$work/old.out" 2>&1 \
  && grep -q "step_00000002 (step 2) of run (none recorded); .*an older checkpoint (format 1)" "$work/old.out" \
  && "$export_bin" --ckpt "$work/tamper_old/step_00000002" --out "$work/old.safetensors" > /dev/null 2>&1 \
  && ok || bad "a format-1 checkpoint: $(grep -E 'resume|rror' "$work/old.out" | head -3)"

# 15. The memory plan is checked before any tensor exists: a 38B model under a 3 GiB cgroup was
# OOM-killed after 3 s with no output. A real memory cgroup (v2 memory.max, or v1's
# memory.limit_in_bytes) when this machine lets us make one, else MemAvailable against a huge model.
huge=(--preset tiny --arch llama --vocab 256 --threads 1 --dim 8192 --layers 48 --heads 64 --steps 1)
cg=""
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  cg=/sys/fs/cgroup$(awk -F: '$1=="0"{print $3}' /proc/self/cgroup)/reliability_test_$$
  mkdir "$cg" 2> /dev/null && echo $((3 << 30)) > "$cg/memory.max" 2> /dev/null || { rmdir "$cg" 2> /dev/null; cg=""; }
elif [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)/reliability_test_$$
  mkdir "$cg" 2> /dev/null && echo $((3 << 30)) > "$cg/memory.limit_in_bytes" 2> /dev/null || { rmdir "$cg" 2> /dev/null; cg=""; }
fi
if [ -n "$cg" ]; then
  in_cg() { bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"; }
  # What is available is the limit less what the cgroup already uses, which varies run to run:
  # at most 3 GiB (3.22 GB), read from the test's own cgroup.
  refused "38B model in a 3 GiB cgroup" " GB is available ($cg/memory." in_cg timeout -k 10 60 "$train" "${huge[@]}"
  avail=$(sed -nE 's/.*but only ([0-9.]+) GB is available.*/\1/p' "$work/refused.out")
  awk -v a="$avail" 'BEGIN {exit !(a > 0 && a <= 3.23)}' && ok \
    || bad "memory plan: available '$avail' GB is not within the 3 GiB cgroup: $(tail -1 "$work/refused.out")"
  grep -qE "38861021184 parameters need 621.78 GB per rank" "$work/refused.out" && ok \
    || bad "memory plan: no numbers in $(tail -1 "$work/refused.out")"
  # --allow-oversubscribe-memory skips the check (the run is then ended by the cgroup's OOM killer
  # or the allocator: only the check's absence is asserted).
  in_cg timeout -k 10 120 "$train" "${huge[@]}" --allow-oversubscribe-memory > "$work/oversub.out" 2>&1
  grep -q "does not fit" "$work/oversub.out" && bad "--allow-oversubscribe-memory still checked" || ok
  for _ in $(seq 50); do rmdir "$cg" 2> /dev/null && break; sleep 0.1; done
  [ -d "$cg" ] && bad "could not remove the test's cgroup $cg" || ok
else
  echo "NOTE: no memory cgroup could be made here; the memory plan is checked against MemAvailable"
  refused "a 645B model against MemAvailable" "(MemAvailable); shard over more ranks" \
    timeout -k 10 60 "$train" --preset tiny --arch llama --vocab 256 --threads 1 --dim 16384 --layers 200 --heads 64 --steps 1
fi

# 17. One job per --ckpt-dir (two jobs on one folder both exited 0, the first's checkpoints
# replaced): rank 0 holds an flock on D/.lock with its pid, host and start time in it. A second
# job (2 ranks) is refused naming the holder; the first, held running until then, goes on.
"$train" "${small[@]}" --steps 100000 --ckpt-dir "$work/one" --ckpt-every 100000 --log-file "$work/one.jsonl" \
  > "$work/one.out" 2>&1 &
job=$!
until [ -s "$work/one.jsonl" ] || ! kill -0 $job 2> /dev/null; do sleep 0.1; done  # training: the lock is held
grep -q "^pid $job on host $(hostname) since " "$work/one/.lock" && ok || bad "lock file: $(cat "$work/one/.lock" 2>&1)"
refused "a second job on one --ckpt-dir" "$work/one is in use by another job (pid $job on host $(hostname) since " \
  "${mpi[@]}" -np 2 "$train" "${small[@]}" --steps 2 --ckpt-dir "$work/one" --resume
kill -0 $job 2> /dev/null && ok || bad "the first job did not survive the second's start: $(tail -2 "$work/one.out")"
kill -TERM $job
wait $job
rc=$?
[ $rc -eq 0 ] && ls "$work/one" | grep -q '^step_' && ok || bad "the first job after the second's refusal: rc $rc: $(tail -2 "$work/one.out")"

# 18. One run's lineage per --ckpt-dir (a fresh run into another run's folder had its step 2
# pruned by --keep, its step 4 replaced the other's, and --resume then loaded the other's step 6):
# a run without --resume into a folder that holds checkpoints is refused by name, nothing removed.
before=$(ls -a "$work/one")
refused "a fresh run into a --ckpt-dir that holds checkpoints" \
  "$work/one already holds the checkpoints of a run (1 folder(s): step_" \
  "$train" "${small[@]}" --steps 2 --ckpt-dir "$work/one" --ckpt-every 1 --keep 1
[ "$(ls -a "$work/one")" = "$before" ] && ok || bad "the refused run changed $work/one: $(ls -a "$work/one" | tr '\n' ' ')"

# 19. --overwrite clears the folders this project wrote (step_*, .tmp_step_*), nothing else, and runs.
echo mine > "$work/one/notes.txt"
mkdir "$work/one/.tmp_step_00000007" && touch "$work/one/.tmp_step_00000007/.fsdp_checkpoint_writing"
"$train" "${small[@]}" --steps 2 --ckpt-dir "$work/one" --ckpt-every 2 --overwrite > "$work/ow.out" 2>&1 \
  && grep -qF "checkpoint: --overwrite: removed 2 checkpoint folder(s) from $work/one" "$work/ow.out" \
  && [ "$(ls "$work/one" | tr '\n' ' ')" = "notes.txt step_00000002 " ] && ok \
  || bad "--overwrite: $(tail -2 "$work/ow.out"); left $(ls -a "$work/one" | tr '\n' ' ')"

# 20. The kernel releases the lock of a job killed with SIGKILL: the next start goes on.
"$train" "${small[@]}" --steps 100000 --ckpt-dir "$work/k9" --log-file "$work/k9.jsonl" > "$work/k9.out" 2>&1 &
job=$!
until [ -s "$work/k9.jsonl" ] || ! kill -0 $job 2> /dev/null; do sleep 0.1; done
grep -q "^pid $job " "$work/k9/.lock" && ok || bad "the killed job's lock file: $(cat "$work/k9/.lock" 2>&1)"
kill -9 $job
wait $job 2> /dev/null
"$train" "${small[@]}" --steps 1 --ckpt-dir "$work/k9" > "$work/k9b.out" 2>&1 && ok \
  || bad "a start after kill -9 of the lock's holder: $(tail -2 "$work/k9b.out")"

# 22. A flood of 5,000 connect-and-close connections on the store's port, while the job is held
# in its first checkpoint write (FSDP_CKPT_HOLD_WRITE, so the flood always meets a running job):
# rank 0's RSS grows by under 20 MB (a finished thread per connection took 14,717 of them to
# 3 GB), and the job's losses are those of the same job without the flood. (store_guard_test
# floods a store with 20,000; here loopback's connects sometimes crawl, at 6 ms each.)
losses_of() { python3 -c "import json,sys; print([json.loads(l)['loss'] for l in open(sys.argv[1]) if l.strip()])" "$1"; }
python3 "$fsdprun" --standalone --nproc_per_node 2 "$train" "${small[@]}" --steps 3 --ckpt-dir "$work/calm" \
  --ckpt-every 2 --log-file "$work/calm.jsonl" > "$work/calm.out" 2>&1 || bad "the job without a flood: $(tail -2 "$work/calm.out")"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
FSDP_CKPT_HOLD_WRITE="$work/hold" python3 "$fsdprun" --nproc_per_node 2 --master_port "$port" "$train" "${small[@]}" \
  --steps 3 --ckpt-dir "$work/flood" --ckpt-every 2 --log-file "$work/flood.jsonl" > "$work/flood.out" 2>&1 &
job=$!
for _ in $(seq 600); do [ -s "$work/hold.held.0" ] && [ -s "$work/hold.held.1" ] && break; kill -0 $job 2> /dev/null || break; sleep 0.1; done
rank0=$(cat "$work/hold.held.0" 2> /dev/null)
rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
if [ -n "$rank0" ] && rss0=$(rss "$rank0"); then
  made=$(python3 - "$port" << 'PY'
import socket, struct, sys
port = int(sys.argv[1])
n = 0
for _ in range(5000):
    s = socket.create_connection(("127.0.0.1", port), 30)
    # A reset on close: no TIME_WAIT left on loopback's ports.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    n += 1
print(n)
PY
)
  [ "$made" = 5000 ] && ok || bad "the flood made ${made:-no} connections of 5000"
  sleep 1  # the last connections' close, seen by the store's poll loop
  rss1=$(rss "$rank0")
  [ $((rss1 - rss0)) -lt 20480 ] && ok || bad "5000 connections took rank 0 from $rss0 to $rss1 kB"
else
  bad "the job never reached its held checkpoint write: $(tail -3 "$work/flood.out")"
fi
touch "$work/hold"
wait $job && [ "$(losses_of "$work/flood.jsonl")" = "$(losses_of "$work/calm.jsonl")" ] && ok \
  || bad "the job under a flood: rc $?, losses $(losses_of "$work/flood.jsonl") vs $(losses_of "$work/calm.jsonl"): $(tail -2 "$work/flood.out")"
echo "store flood: rank 0 VmRSS ${rss0:-?} -> ${rss1:-?} kB over 5000 connections"
summary
