#!/usr/bin/env bash
# What fsdp-train, fsdp-export and fsdp-generate do with the files around them: a link where
# they write is refused by name and the file behind it is left alone; a FIFO or a device where
# they read is refused at once (never a hang); retention and --overwrite touch only the
# project's step_NNNNNNNN folders (with its seal), a look-alike is never resumed from or written
# over, and a .bin shard truncated during training is a named error, not a SIGBUS.
set -uo pipefail
bindir=$1
source "$(dirname "$0")/testlib.sh"
use_tools "$bindir"
export OMP_WAIT_POLICY=PASSIVE
T=("$train" --preset tiny --arch llama --vocab 256 --threads 1 --batch 2 --sample-tokens 0
  --data /usr/share/common-licenses/GPL-3)
expect_fail() {  # expect_fail NAME NEEDLE command...  (a hang is killed after 20 s and fails)
  local name=$1 needle=$2
  shift 2
  timeout -s KILL 20 "$@" > "$work/bad.out" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then bad "$name: succeeded"
  elif [ $rc -eq 137 ]; then bad "$name: hung (killed after 20 s)"
  elif ! grep -qF -- "$needle" "$work/bad.out"; then bad "$name: rc $rc, no '$needle' in: $(tail -3 "$work/bad.out")"
  else ok; fi
}
"${T[@]}" --steps 4 --ckpt-dir "$work/run" --ckpt-every 2 > "$work/run.out" 2>&1 || bad "the first run failed: $(tail -3 "$work/run.out")"

# 1. Links where the project writes: the lock, the write probe and the log are refused by name.
cp -r "$work/run" "$work/l1"
echo keep > "$work/a"; rm -f "$work/l1/.lock"; ln -s "$work/a" "$work/l1/.lock"
expect_fail "lock link" "$work/l1/.lock" "${T[@]}" --steps 6 --ckpt-dir "$work/l1" --resume
[ "$(cat "$work/a")" = keep ] && ok || bad "the lock wrote through its link: $(cat "$work/a")"
cp -r "$work/run" "$work/l2"
echo keep > "$work/b"; ln -s "$work/b" "$work/l2/.fsdp_write_test_rank0"
expect_fail "probe link" ".fsdp_write_test_rank0" "${T[@]}" --steps 6 --ckpt-dir "$work/l2" --resume
[ "$(cat "$work/b")" = keep ] && ok || bad "the write probe truncated its link's target"
echo keep > "$work/c"; ln -s "$work/c" "$work/log.jsonl"
expect_fail "log link" "$work/log.jsonl" "${T[@]}" --steps 1 --log-file "$work/log.jsonl"
[ "$(cat "$work/c")" = keep ] && ok || bad "the log wrote through its link"

# 7. Retention and --overwrite touch only the project's folders; resume never loads a look-alike.
cp -r "$work/run" "$work/r"
mkdir "$work/r/step_00000002_eval"; echo 1 > "$work/r/step_00000002_eval/results.txt"
cp -r "$work/r/step_00000004" "$work/r/step_00000004.bak"
mkdir "$work/r/step_00000003"; echo n > "$work/r/step_00000003/notes.txt"  # the right name, not ours
"${T[@]}" --steps 6 --ckpt-dir "$work/r" --ckpt-every 2 --resume --keep 1 > "$work/r.out" 2>&1 || bad "resume --keep 1 failed: $(tail -3 "$work/r.out")"
grep -q "resume: loaded .*step_00000004 (step 4)" "$work/r.out" && ok || bad "resume did not load step_00000004: $(grep resume: "$work/r.out")"
[ -f "$work/r/step_00000002_eval/results.txt" ] && ok || bad "--keep removed step_00000002_eval"
[ -d "$work/r/step_00000004.bak" ] && ok || bad "--keep removed step_00000004.bak"
[ ! -d "$work/r/step_00000002" ] && [ -d "$work/r/step_00000006" ] && ok || bad "--keep 1 did not prune: $(ls "$work/r")"
mkdir "$work/r/step_results_for_paper"; echo t > "$work/r/step_results_for_paper/table.tex"
"${T[@]}" --steps 2 --ckpt-dir "$work/r" --overwrite > "$work/o.out" 2>&1 || bad "--overwrite failed: $(tail -3 "$work/o.out")"
[ -f "$work/r/step_results_for_paper/table.tex" ] && ok || bad "--overwrite removed step_results_for_paper"
[ -f "$work/r/step_00000002_eval/results.txt" ] && ok || bad "--overwrite removed step_00000002_eval"
[ -f "$work/r/step_00000003/notes.txt" ] && ok || bad "--keep or --overwrite removed step_00000003/ without the seal"
expect_fail "a save over the user's step_00000003" "step_00000003 exists and is not a checkpoint this project wrote" \
  "${T[@]}" --steps 4 --ckpt-dir "$work/r" --ckpt-every 3 --overwrite
[ -f "$work/r/step_00000003/notes.txt" ] && ok || bad "a save replaced the user's step_00000003/"

# 8. FIFOs and devices where the project reads are refused at once.
mkfifo "$work/fifo"
cp -r "$work/run" "$work/f1"; rm "$work/f1/step_00000004/shard_00000.safetensors"
ln -s "$work/fifo" "$work/f1/step_00000004/shard_00000.safetensors"
expect_fail "shard FIFO" "not a regular file" "${T[@]}" --steps 6 --ckpt-dir "$work/f1" --resume
expect_fail "export of a shard FIFO" "not a regular file" "$export_bin" --ckpt "$work/f1/step_00000004" --out "$work/x.safetensors"
cp -r "$work/run" "$work/f2"; rm "$work/f2/step_00000004/shard_00000.safetensors"
ln -s /dev/zero "$work/f2/step_00000004/shard_00000.safetensors"
expect_fail "shard /dev/zero" "not a regular file" "${T[@]}" --steps 6 --ckpt-dir "$work/f2" --resume
expect_fail "--init-from FIFO" "not a regular file" "${T[@]}" --steps 1 --init-from "$work/fifo"
expect_fail "--tokenizer FIFO (generate)" "not a regular file" "$gen" --ckpt "$work/run" --tokenizer "$work/fifo" --tokens 2
cp -r "$work/run" "$work/f3"; rm "$work/f3/step_00000004/tokenizer.json"; mkfifo "$work/f3/step_00000004/tokenizer.json"
expect_fail "tokenizer.json FIFO (generate)" "not a regular file" "$gen" --ckpt "$work/f3" --tokens 2
expect_fail "--tokenizer FIFO (train)" "not a regular file" "${T[@]}" --steps 1 --tokenizer "$work/fifo"
expect_fail "--log-file FIFO" "not a regular file" "${T[@]}" --steps 1 --log-file "$work/fifo"

# 9. Crafted sizes are refused by name before anything is built, under a 2 GB address space: a
# --layers flag (1e6 took the memory plan, then a replay of the step, to std::bad_alloc), and a checkpoint whose
# metadata.json says 3e6 layers, resealed as a careful forger would (fsdp-export reached 7 GB).
limited=(bash -c 'ulimit -v 2000000 && exec "$@"' limited)
expect_fail "--layers 1000000" "the model does not fit: 852480131328 parameters" "${limited[@]}" "${T[@]}" --steps 1 --layers 1000000
cp -r "$work/run" "$work/big"
python3 "$(dirname "$0")/edit_metadata.py" "$work/big/step_00000004" 'm["config"]["layers"] = 3_000_000' reseal
expect_fail "export of 3e6 resealed layers" "the config and the tensors disagree" "${limited[@]}" "$export_bin" --ckpt "$work/big/step_00000004" --out "$work/big.safetensors"
expect_fail "generate from 3e6 resealed layers" "the config and the tensors disagree" "${limited[@]}" "$gen" --ckpt "$work/big" --tokens 2
[ ! -e "$work/big.safetensors" ] && ok || bad "the refused export left a file"

# 10. A .bin shard truncated under a running training is a named error, never a SIGBUS (rc 135).
python3 - "$work/shard.bin" << 'PY'
import struct, sys, random
random.seed(1)
n = 200000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(256) for _ in range(n)]))
PY
wait_for() {  # wait_for FILE PID: until FILE is non-empty or PID has ended (60 s at most)
  for _ in $(seq 600); do [ -s "$1" ] && return 0; kill -0 "$2" 2> /dev/null || return 1; sleep 0.1; done
  return 1
}
rm -f "$work/t.jsonl"
"$train" --preset tiny --arch llama --vocab 256 --threads 1 --batch 2 --sample-tokens 0 --data "$work/shard.bin" \
  --steps 100000 --log-file "$work/t.jsonl" > "$work/t.out" 2>&1 &
pid=$!
wait_for "$work/t.jsonl" $pid && truncate -s 1024 "$work/shard.bin"
timeout -s KILL 60 tail --pid=$pid -f /dev/null
wait $pid
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 135 ] && grep -q "shard '$work/shard.bin'.*truncated" "$work/t.out" && ok ||
  bad "a shard truncated during training: rc $rc: $(tail -2 "$work/t.out")"

summary
