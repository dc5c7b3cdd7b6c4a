#!/usr/bin/env bash
# Run by reliability_test.sh inside `unshare -m` (a private mount namespace): writes onto real
# small tmpfs mounts that are full or nearly full. Prints "FAIL: ..." lines and exits non-zero on
# a failure. full_disk.sh TRAIN EXPORT WORK
set -uo pipefail
train=$1 export_bin=$2 work=$3
source "$(dirname "$0")/testlib.sh"
small=(--preset tiny --arch llama --dim 32 --layers 1 --heads 4 --vocab 256 --seq 16 --batch 2 --threads 1)
"$train" "${small[@]}" --data /usr/share/common-licenses/GPL-3 --steps 1 --ckpt-dir "$work/ck" \
  --ckpt-every 1 > "$work/fd_ck0.out" 2>&1 || bad "full disk: the checkpoint to export: $(tail -1 "$work/fd_ck0.out")"
mnt="$work/mnt"
mkdir -p "$mnt"
mount --make-rprivate / 2> /dev/null
# disk FREE_KB: a fresh 2 MiB tmpfs at $mnt with about FREE_KB left
disk() {
  umount "$mnt" 2> /dev/null
  mount -t tmpfs -o size=2048k tmpfs "$mnt" || { bad "cannot mount a tmpfs"; summary; exit 1; }
  head -c $(((2048 - $1) * 1024)) /dev/zero > "$mnt/fill"
}

# A --log-file on a full filesystem stops the run with errno's words (it gave rc 0 and 0 bytes).
disk 0
cat /dev/zero > "$mnt/fill2" 2> /dev/null
"$train" "${small[@]}" --steps 3 --log-file "$mnt/log.jsonl" > "$work/fd_log.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "writing --log-file '$mnt/log.jsonl' failed at step 0: No space left on device" \
  "$work/fd_log.out" && ok || bad "--log-file on a full disk: rc $rc: $(tail -2 "$work/fd_log.out")"

# fsdp-export with less room than it needs, at several amounts: it either writes every file whole
# or fails naming errno, and never leaves a temporary or an empty file (tokenizer_config.json and
# generation_config.json were 0 bytes with rc 0: under the stream buffer, they failed at close).
failed=0
for free in 0 8 96 176 180 184 188 192 196 200 204 400; do
  disk $free
  mkdir -p "$mnt/hf"
  "$export_bin" --ckpt "$work/ck" --out "$mnt/hf/model.safetensors" > "$work/fd_exp.out" 2>&1
  rc=$?
  left=$(find "$mnt/hf" -name '*.tmp*' | tr '\n' ' ')
  empty=$(find "$mnt/hf" -type f -empty | tr '\n' ' ')
  [ -z "$left" ] && ok || bad "export with $free KB free left temporaries: $left"
  [ -z "$empty" ] && ok || bad "export with $free KB free (rc $rc) left empty files: $empty"
  if [ $rc -eq 0 ]; then
    [ "$(find "$mnt/hf" -type f | wc -l)" -eq 5 ] && ok \
      || bad "export with $free KB free: rc 0 but not 5 files: $(ls "$mnt/hf" | tr '\n' ' ')"
  else
    failed=$((failed + 1))
    grep -q "No space left on device" "$work/fd_exp.out" && ok \
      || bad "export with $free KB free: rc $rc without errno's words: $(tail -1 "$work/fd_exp.out")"
  fi
done
[ $failed -gt 0 ] && ok || bad "export never ran out of room: the test's sizes are wrong"

# A GGUF export that fails names errno and leaves no model.gguf.tmp behind.
disk 96
"$export_bin" --ckpt "$work/ck" --gguf "$mnt/model.gguf" > "$work/fd_gguf.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "No space left on device" "$work/fd_gguf.out" && ok \
  || bad "GGUF export on a full disk: rc $rc: $(tail -1 "$work/fd_gguf.out")"
[ -z "$(ls "$mnt" | grep -v '^fill$')" ] && ok || bad "GGUF export left: $(ls "$mnt" | tr '\n' ' ')"

# A checkpoint on a full disk fails naming errno; no step folder appears (the unfinished one is a
# .tmp_ folder).
disk 24
"$train" "${small[@]}" --steps 1 --ckpt-dir "$mnt/ck" --ckpt-every 1 > "$work/fd_ck.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "No space left on device" "$work/fd_ck.out" && [ ! -e "$mnt/ck/step_00000001" ] && ok \
  || bad "checkpoint on a full disk: rc $rc: $(tail -1 "$work/fd_ck.out")"
umount "$mnt"
summary
