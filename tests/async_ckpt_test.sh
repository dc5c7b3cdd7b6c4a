#!/usr/bin/env bash
# fsdp-train --async-checkpoint at 2 ranks: the checkpoints are the synchronous save's, byte for
# byte, and a resume from them is bit-exact; a rank SIGKILLed while its background write is held
# (FSDP_CKPT_HOLD_WRITE) leaves the previous checkpoint as the one --resume takes; a background
# write that fails (a full tmpfs) is an error at the next step naming the file, exit non-zero;
# SIGTERM during a held write waits for it, commits it and stops as a stop does (exit 0). No case
# depends on timing: the writes are held by the knob until the test releases them.
set -uo pipefail
bindir=$1
train="$bindir/fsdp-train"
work=$(mktemp -d)
mnt="$work/full"
trap 'kill $(jobs -p) 2> /dev/null; mountpoint -q "$mnt" && umount "$mnt"; rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"
export OMP_WAIT_POLICY=PASSIVE FSDP_COLLECTIVE_TIMEOUT_S=120
mpi=("${mpirun_local[@]}" -np 2)
cat /usr/share/common-licenses/* > "$work/text.txt" 2> /dev/null
A=(--preset tiny --arch llama --vocab 256 --dim 48 --layers 2 --heads 2 --seq 32 --lr 3e-3 --warmup-steps 2
  --data "$work/text.txt" --sample-tokens 0 --threads 1 --batch 6)
losses() { python3 -c "import json,sys; [print(repr(json.loads(l)['loss'])) for l in open(sys.argv[1]) if l.strip()]" "$1"; }
# same_shard A B: two shard files hold the same header and bytes, but for the run id (each run has
# its own, in the header's __metadata__).
same_shard() {
  python3 - "$1" "$2" << 'PY'
import json, struct, sys
def body(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.get("__metadata__", {}).pop("run_id", None)
    return h, b[8 + n:]
sys.exit(body(sys.argv[1]) != body(sys.argv[2]))
PY
}
wait_for() {  # wait_for FILE PID: until FILE exists (0) or PID ended (1)
  while [ ! -e "$1" ]; do kill -0 "$2" 2> /dev/null || return 1; sleep 0.05; done
}

# a. The async run's losses and checkpoints are the sync run's; its resume is bit-exact.
"${mpi[@]}" "$train" "${A[@]}" --steps 6 --ckpt-dir "$work/sync" --ckpt-every 3 --log-file "$work/sync.jsonl" \
  > "$work/sync.out" 2>&1 || bad "sync run failed: $(tail -3 "$work/sync.out")"
"${mpi[@]}" "$train" "${A[@]}" --steps 6 --ckpt-dir "$work/async" --ckpt-every 3 --async-checkpoint \
  --log-file "$work/async.jsonl" > "$work/async.out" 2>&1 || bad "async run failed: $(tail -3 "$work/async.out")"
grep -q "checkpoint: step 3 copied in .* writing in the background" "$work/async.out" && ok || bad "no background write: $(grep checkpoint "$work/async.out")"
[ "$(losses "$work/sync.jsonl")" = "$(losses "$work/async.jsonl")" ] && ok || bad "async run's losses differ from the sync run's"
for s in 3 6; do
  for f in shard_00000.safetensors shard_00001.safetensors; do
    same_shard "$work/sync/step_0000000$s/$f" "$work/async/step_0000000$s/$f" && ok || bad "step $s $f differs from the sync save's"
  done
done
rm -rf "$work/async/step_00000006"
"${mpi[@]}" "$train" "${A[@]}" --steps 6 --ckpt-dir "$work/async" --resume --async-checkpoint \
  --log-file "$work/resumed.jsonl" > "$work/resumed.out" 2>&1 || bad "resume failed: $(tail -3 "$work/resumed.out")"
grep -q "resume: loaded .*step_00000003 (step 3)" "$work/resumed.out" && ok || bad "resume did not load step 3"
[ "$(losses "$work/sync.jsonl" | tail -3)" = "$(losses "$work/resumed.jsonl")" ] && ok \
  || bad "resume from the async checkpoint is not bit-exact"

# b. Rank 1 SIGKILLed while its background write of step 4 is held: step 2 is what --resume takes.
"${mpi[@]}" "$train" "${A[@]}" --steps 2 --ckpt-dir "$work/kill" --ckpt-every 2 --async-checkpoint \
  > /dev/null 2>&1 || bad "first leg failed"
FSDP_CKPT_HOLD_WRITE="$work/release" "${mpi[@]}" "$train" "${A[@]}" --steps 6 --ckpt-dir "$work/kill" \
  --ckpt-every 2 --resume --async-checkpoint > "$work/kill.out" 2>&1 &
job=$!
if wait_for "$work/release.held.1" $job && wait_for "$work/release.held.0" $job; then
  ok
  kill -9 "$(cat "$work/release.held.1")"
else
  bad "the held write never started: $(tail -3 "$work/kill.out")"
fi
wait $job && bad "the job survived its rank's SIGKILL" || ok
[ -f "$work/kill/step_00000002/metadata.json" ] && [ ! -e "$work/kill/step_00000004" ] \
  && [ -d "$work/kill/.tmp_step_00000004" ] && ok || bad "after SIGKILL: $(ls -a "$work/kill")"
"${mpi[@]}" "$train" "${A[@]}" --steps 6 --ckpt-dir "$work/kill" --resume --log-file "$work/afterkill.jsonl" \
  > "$work/afterkill.out" 2>&1 || bad "resume after SIGKILL failed: $(tail -3 "$work/afterkill.out")"
grep -q "resume: loaded .*step_00000002 (step 2)" "$work/afterkill.out" && ok || bad "resume after SIGKILL did not take step 2"
[ "$(losses "$work/sync.jsonl" | tail -4)" = "$(losses "$work/afterkill.jsonl")" ] && ok \
  || bad "resume after SIGKILL is not bit-exact"

# c. A background write into a full file system (a 64 KiB tmpfs) fails: an error at the next
# step, naming the file and the reason, exit non-zero; no checkpoint is made.
mkdir -p "$mnt"
if mount -t tmpfs -o size=64k tmpfs "$mnt" 2> /dev/null; then
  if "${mpi[@]}" "$train" "${A[@]}" --steps 4 --ckpt-dir "$mnt/ck" --ckpt-every 2 --async-checkpoint \
    > "$work/fail.out" 2>&1; then
    bad "a failed background write went unnoticed"
  else
    ok
  fi
  grep -q "fsdp-train: error: \[checkpoint\] the background write of step 2 failed: .*shard_00000.safetensors.*No space left on device" \
    "$work/fail.out" && ok || bad "the failure does not name the file and the reason: $(grep error "$work/fail.out")"
  grep -q "^step 2 |" "$work/fail.out" && ! grep -q "^step 3 |" "$work/fail.out" && ok \
    || bad "the failure did not stop the run at the step after the save: $(grep '^step' "$work/fail.out")"
  [ ! -e "$mnt/ck/step_00000002" ] && ok || bad "a failed write left a checkpoint"
  umount "$mnt"
else
  echo "SKIP c: cannot mount a tmpfs here (not root?)"
fi

# d. SIGTERM while the write of step 4 is held: the stop waits for it, commits it, saves the stop
# step and exits 0.
rm -f "$work"/release*
cp -r "$work/sync/step_00000003" "$work/term0" && mkdir "$work/term" && mv "$work/term0" "$work/term/step_00000003"
FSDP_CKPT_HOLD_WRITE="$work/release" "${mpi[@]}" "$train" "${A[@]}" --steps 200 --ckpt-dir "$work/term" \
  --ckpt-every 4 --resume --async-checkpoint > "$work/term.out" 2> "$work/term.err" &
job=$!
if wait_for "$work/release.held.0" $job && wait_for "$work/release.held.1" $job; then ok; else bad "no held write"; fi
kill -TERM "$(cat "$work/release.held.0")" "$(cat "$work/release.held.1")"
for _ in $(seq 1200); do
  grep -q "waiting for the background write of step 4" "$work/term.out" "$work/term.err" && break
  kill -0 $job 2> /dev/null || break
  sleep 0.05
done
grep -q "waiting for the background write of step 4" "$work/term.out" "$work/term.err" && ok \
  || bad "the stop did not wait for the write: $(tail -3 "$work/term.err")"
[ ! -e "$work/term/step_00000004" ] && ok || bad "step 4 was committed while its write was held"
touch "$work/release"
wait $job && ok || bad "the stopped run exited non-zero: $(tail -3 "$work/term.err")"
stopped=$(sed -n 's/.*SIGTERM received: stopped after step [0-9]*; checkpoint of step \([0-9]*\) in .*/\1/p' "$work/term.err")
[ -n "$stopped" ] && ok || bad "no stop message: $(tail -3 "$work/term.err")"
[ -f "$work/term/step_00000004/metadata.json" ] && [ -f "$work/term/$(printf 'step_%08d' "${stopped:-0}")/metadata.json" ] \
  && ok || bad "after the stop: $(ls -a "$work/term")"
"${mpi[@]}" "$train" "${A[@]}" --steps $((stopped + 1)) --ckpt-dir "$work/term" --resume > "$work/termr.out" 2>&1 \
  && grep -q "resume: loaded .*(step $stopped)" "$work/termr.out" && ok || bad "resume after the stop: $(tail -3 "$work/termr.out")"

summary
