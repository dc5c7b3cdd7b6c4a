#!/usr/bin/env bash
# fsdp-train as a training command: resume is bit-exact, checkpoints reshard
# 2 -> 3 and 3 -> 1 ranks, bad checkpoints are refused with the file and the
# problem named, a SIGKILL during a write leaves the previous checkpoint
# loadable, --keep prunes, .bin shards load (and bad ids are named), the
# export's safetensors and GGUF parse back, and fsdp-generate samples from both.
set -uo pipefail
bindir=$1
fsdprun=$2
scripts=$3
source "$(dirname "$0")/testlib.sh"
use_tools "$bindir"
export OMP_WAIT_POLICY=PASSIVE FSDP_COLLECTIVE_TIMEOUT_S=120
mpi=("${mpirun_local[@]}")
cat /usr/share/common-licenses/* > "$work/text.txt" 2> /dev/null
A=(--preset tiny --arch llama --vocab 256 --dim 48 --layers 2 --heads 2 --seq 32 --lr 3e-3 --warmup-steps 2
  --lr-decay cosine --min-lr 3e-4 --wd-2d-only --grad-clip 1.0 --data "$work/text.txt" --sample-tokens 0 --threads 1)
losses() { python3 -c "import json,sys; [print(repr(json.loads(l)['loss'])) for l in open(sys.argv[1]) if l.strip()]" "$1"; }
expect_fail() {  # expect_fail NAME NEEDLE command...
  local name=$1 needle=$2
  shift 2
  if "$@" > "$work/bad.out" 2>&1; then bad "$name: succeeded"
  elif ! grep -qF -- "$needle" "$work/bad.out"; then bad "$name: no '$needle' in: $(tail -3 "$work/bad.out")"
  else ok; fi
}

# 1. Resume is bit-exact (losses compared at full precision from --log-file).
"$train" "${A[@]}" --batch 12 --steps 6 --log-file "$work/full.jsonl" > /dev/null 2>&1 || bad "uninterrupted run failed"
"$train" "${A[@]}" --batch 12 --steps 3 --ckpt-dir "$work/ck1" --ckpt-every 3 > /dev/null 2>&1 || bad "first half failed"
"$train" "${A[@]}" --batch 12 --steps 6 --ckpt-dir "$work/ck1" --resume --log-file "$work/resumed.jsonl" \
  > "$work/resume.out" 2>&1 || bad "resume failed: $(tail -3 "$work/resume.out")"
grep -q "resume: loaded .*step_00000003 (step 3)" "$work/resume.out" && ok || bad "resume did not load step 3"
if [ "$(losses "$work/full.jsonl" | tail -3)" = "$(losses "$work/resumed.jsonl")" ]; then ok; else
  bad "resume is not bit-exact: $(losses "$work/full.jsonl" | tail -3 | tr '\n' ' ') vs $(losses "$work/resumed.jsonl" | tr '\n' ' ')"
fi

# 1b. ... and at 2 ranks under mpirun.
"${mpi[@]}" -np 2 "$train" "${A[@]}" --batch 6 --steps 6 --log-file "$work/full2.jsonl" > /dev/null 2>&1 || bad "2-rank run failed"
"${mpi[@]}" -np 2 "$train" "${A[@]}" --batch 6 --steps 3 --ckpt-dir "$work/ck12" --ckpt-every 3 > /dev/null 2>&1 \
  || bad "2-rank first half failed"
"${mpi[@]}" -np 2 "$train" "${A[@]}" --batch 6 --steps 6 --ckpt-dir "$work/ck12" --resume --log-file "$work/resumed2.jsonl" \
  > /dev/null 2>&1 || bad "2-rank resume failed"
[ "$(losses "$work/full2.jsonl" | tail -3)" = "$(losses "$work/resumed2.jsonl")" ] && ok || bad "2-rank resume is not bit-exact"

# 2. Resharding: save at 2 ranks, resume at 3; save at 3, resume at 1 (global batch 12 throughout).
close() {  # close A.jsonl B.jsonl: the last 3 losses agree to 1e-5
  paste <(losses "$1" | tail -3) <(losses "$2" | tail -3) |
    awk '{d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad = 1; n++} END {exit (bad || n != 3)}'
}
"${mpi[@]}" -np 2 "$train" "${A[@]}" --batch 6 --steps 3 --ckpt-dir "$work/ck2" --ckpt-every 3 > /dev/null 2>&1 \
  || bad "2-rank save failed"
"$fsdprun" --standalone --nproc_per_node 3 "$train" "${A[@]}" --batch 4 --steps 6 --ckpt-dir "$work/ck2" --resume \
  --log-file "$work/r23.jsonl" > "$work/r23.out" 2>&1 || bad "3-rank resume failed: $(tail -3 "$work/r23.out")"
close "$work/full.jsonl" "$work/r23.jsonl" && ok || bad "2 -> 3 resharded losses differ"
"$fsdprun" --standalone --nproc_per_node 3 "$train" "${A[@]}" --batch 4 --steps 3 --ckpt-dir "$work/ck3" \
  --ckpt-every 3 > /dev/null 2>&1 || bad "3-rank save failed"
"$train" "${A[@]}" --batch 12 --steps 6 --ckpt-dir "$work/ck3" --resume --log-file "$work/r31.jsonl" \
  > "$work/r31.out" 2>&1 || bad "1-rank resume failed: $(tail -3 "$work/r31.out")"
close "$work/full.jsonl" "$work/r31.jsonl" && ok || bad "3 -> 1 resharded losses differ"

# 3. Bad checkpoints: each refused, naming the file and the problem.
ck="$work/ck2/step_00000003"
# (Each copies step 3 alone: the 3-rank resume above, which took the run's --ckpt-every 3 from
# its checkpoint, also saved step 6.)
mkdir "$work/trunc" && cp -r "$ck" "$work/trunc/" && truncate -s -100 "$work/trunc/step_00000003/shard_00001.safetensors"
expect_fail "truncated shard" "shard_00001.safetensors: checksum" "$train" "${A[@]}" --batch 12 --steps 4 --ckpt-dir "$work/trunc" --resume
mkdir "$work/flip" && cp -r "$ck" "$work/flip/" && printf '\x55' | dd of="$work/flip/step_00000003/shard_00000.safetensors" bs=1 seek=2000 conv=notrunc 2> /dev/null
expect_fail "corrupted shard" "shard_00000.safetensors: checksum" "$train" "${A[@]}" --batch 12 --steps 4 --ckpt-dir "$work/flip" --resume
mkdir "$work/missing" && cp -r "$ck" "$work/missing/" && rm "$work/missing/step_00000003/shard_00001.safetensors"
expect_fail "missing shard" "is missing shard_00001.safetensors (the checkpoint was written by 2 shards)" \
  "$train" "${A[@]}" --batch 12 --steps 4 --ckpt-dir "$work/missing" --resume
expect_fail "config mismatch" "was saved with dim 48 but this run has dim 32" \
  "$train" "${A[@]}" --dim 32 --batch 12 --steps 4 --ckpt-dir "$work/ck2" --resume
cmp -s "$ck/shard_00000.safetensors" "$work/ck2/step_00000003/shard_00000.safetensors" && ok || bad "a refused load changed the checkpoint"

# 4. SIGKILL in the middle of a checkpoint write leaves the previous one loadable.
FSDP_CKPT_SLOW_WRITE_MS=4000 "$train" "${A[@]}" --batch 12 --steps 4 --ckpt-dir "$work/kill" --ckpt-every 2 \
  > "$work/kill.out" 2>&1 &
victim=$!
for _ in $(seq 200); do [ -d "$work/kill/.tmp_step_00000004" ] && break; sleep 0.1; done
[ -d "$work/kill/.tmp_step_00000004" ] && ok || bad "the second checkpoint write never started"
kill -9 $victim 2> /dev/null
wait $victim 2> /dev/null
[ -f "$work/kill/step_00000002/metadata.json" ] && [ ! -d "$work/kill/step_00000004" ] && ok || bad "after SIGKILL: $(ls -a "$work/kill")"
"$train" "${A[@]}" --batch 12 --steps 4 --ckpt-dir "$work/kill" --resume > "$work/after.out" 2>&1 \
  && grep -q "resume: loaded .*step_00000002 (step 2)" "$work/after.out" && ok || bad "resume after SIGKILL: $(tail -3 "$work/after.out")"

# 5. --keep prunes the oldest.
"$train" "${A[@]}" --batch 4 --steps 4 --ckpt-dir "$work/keep" --ckpt-every 1 --keep 2 > /dev/null 2>&1
[ "$(ls "$work/keep" | tr '\n' ' ')" = "step_00000003 step_00000004 " ] && ok || bad "--keep 2 left: $(ls "$work/keep")"

# 6. llm.c shards from scripts/prepare_text.py, a validation split, and a token id the vocab cannot hold.
python3 "$scripts/prepare_text.py" "$work/text.txt" --out "$work/shards" --shard-tokens 50000 > /dev/null || bad "prepare_text failed"
"$train" "${A[@]}" --batch 4 --steps 2 --data "$work/shards/train_*.bin" --val-data "$work/shards/val_000000.bin" \
  --eval-every 2 > "$work/bin.out" 2>&1 && grep -q "val loss" "$work/bin.out" && grep -q "shard(s)" "$work/bin.out" \
  && ok || bad "training on .bin shards: $(tail -3 "$work/bin.out")"
python3 -c "
import struct; h=[0]*256; h[0]=20240520; h[1]=1; h[2]=100
open('$work/big.bin','wb').write(struct.pack('<256i',*h)+struct.pack('<100H',*([300]+[1]*99)))"
expect_fail "token id above vocab" "token id 300 at position 0 is not below vocab 256" "$train" "${A[@]}" --data "$work/big.bin" --steps 1

# 7. Export: safetensors (Hugging Face names + config.json) parsed back, and a GGUF written
# (tests/export_test.py reads it with llama.cpp's gguf package).
"$export_bin" --ckpt "$work/ck1" --out "$work/exp/model.safetensors" --gguf "$work/exp/model.gguf" > "$work/exp.out" 2>&1 \
  || bad "export failed: $(tail -3 "$work/exp.out")"
python3 - "$work/exp" << 'PY' && ok || bad "exported files do not parse"
import json, struct, sys
d = sys.argv[1]
b = open(f"{d}/model.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
assert "model.layers.0.self_attn.q_proj.weight" in h and "lm_head.weight" in h, sorted(h)
assert max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__") == len(b) - 8 - n
cfg = json.load(open(f"{d}/config.json"))
assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["hidden_size"] == 48
assert open(f"{d}/model.gguf", "rb").read(4) == b"GGUF"  # its fields: export_test, with gguf
PY
# 8. fsdp-generate from the mapped export and from the checkpoint.
"$gen" --model "$work/exp/model.safetensors" --tokens 20 > "$work/gen.out" 2>&1 && grep -q "tokens/s" "$work/gen.out" \
  && grep -q "in place" "$work/gen.out" && ok || bad "generate --model: $(tail -3 "$work/gen.out")"
"$gen" --ckpt "$work/ck1" --tokens 20 > "$work/gen2.out" 2>&1 && grep -q "tokens/s" "$work/gen2.out" && ok \
  || bad "generate --ckpt: $(tail -3 "$work/gen2.out")"
expect_fail "generate without a model" "give exactly one of --model and --ckpt" "$gen" --tokens 3

# 9. The seed architecture exports PyTorch's names; PyTorch loads them where it is installed.
"$train" --preset tiny --dim 32 --layers 1 --heads 4 --vocab 64 --seq 16 --batch 2 --steps 1 --ckpt-dir "$work/seed" \
  --ckpt-every 1 > /dev/null 2>&1 && "$export_bin" --ckpt "$work/seed" --out "$work/seed.safetensors" > /dev/null 2>&1 \
  && ok || bad "seed export failed"
if /usr/bin/python3 -c "import torch" 2> /dev/null; then
  (cd "$scripts/.." && /usr/bin/python3 -m scripts.check_export_torch "$work/seed.safetensors") > "$work/torch.out" 2>&1 && ok \
    || bad "PyTorch could not load the export: $(tail -3 "$work/torch.out")"
else
  echo "note: python3-torch not installed; skipped the PyTorch load of the export"
fi

summary
