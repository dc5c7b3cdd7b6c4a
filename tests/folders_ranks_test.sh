#!/usr/bin/env bash
# The fourth hostile pass's part B (docs/reliability.md), each case refused by name with exit 1,
# or (legal input) run:
#   1. a model folder's files are read only inside its tree: a chat_template.jinja, tokenizer.json
#      or weight_map file that leads out of it (a link, '..') is refused naming the file and
#      where it leads, and the secret behind it reaches no output; a Hugging Face cache's
#      snapshots/<rev>/file -> ../../blobs/<hash> links train;
#   2. checkpoint folders: a --ckpt-dir inside another run's folder (a step folder, a folder with
#      .lock), '/', or the --init-from folder is refused and nothing is written there; --overwrite
#      removes a .tmp_step_ folder only with the project's writing mark;
#   3. ranks with --config files of other contents (same flags on the command line) are refused
#      naming the flag; files of the same contents at other paths run;
#   4. the ranks of a re-executed fsdp-train (OpenBLAS's core type) are named fsdp-train;
#   5. silent results: chat/row samples in a .json or .JSONL file are read as samples, a .json of
#      another form is refused; a checkpoint holding NaN is refused by --resume and fsdp-export
#      (full weights and a LoRA adapter: --peft, --out), naming the tensor; --pack-eos -5,
#      --pack-eos without --pack, --val-data equal to --data, and samples without a target token
#      are refused before the first step.
set -uo pipefail
bindir=$(cd "$1" && pwd)
fsdprun=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
source "$(dirname "$0")/testlib.sh"
use_tools "$bindir"
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
cd "$work" || exit 1
secret="SECRET-hf_token-7d1c0ffee"
echo "$secret" > secret.txt
# expect_fail NAME NEEDLE command...: exit code 1 within 20 s, NEEDLE in the output, no secret.
expect_fail() {
  local name=$1 needle=$2
  shift 2
  timeout -s KILL 20 "$@" > bad.out 2>&1
  local rc=$?
  if [ $rc -ne 1 ]; then bad "$name: rc $rc (expected 1): $(tail -3 bad.out)"
  elif ! grep -qF -- "$needle" bad.out; then bad "$name: no '$needle' in: $(tail -3 bad.out)"
  elif grep -qF "$secret" bad.out; then bad "$name: the secret's text was printed"
  else ok; fi
}
head -c 20000 /usr/share/common-licenses/GPL-3 > text.txt
A=(--arch llama --vocab 258 --dim 32 --layers 1 --heads 2 --seq 16 --batch 2 --tokenizer bytes
  --sample-tokens 0 --threads 1)
"$train" "${A[@]}" --data text.txt --steps 2 --ckpt-dir ck --ckpt-every 2 > train.out 2>&1 || bad "training failed: $(tail -3 train.out)"
"$export_bin" --ckpt ck --out hf/model.safetensors > export.out 2>&1 || bad "export failed: $(tail -3 export.out)"
[ ! -e ck/step_00000002/.fsdp_checkpoint_writing ] && ok || bad "a sealed checkpoint kept its writing mark"
F=(--data text.txt --seq 16 --batch 2 --sample-tokens 0 --threads 1 --steps 1)

# 1. Links out of a model folder.
cp -r hf m1 && ln -s "$work/secret.txt" m1/chat_template.jinja
expect_fail "chat_template.jinja linked out (train)" "m1/chat_template.jinja' leads to '$work/secret.txt', outside the model folder" \
  "$train" "${F[@]}" --init-from m1 --ckpt-dir ck_m1
[ ! -e ck_m1 ] && ok || bad "a refused --init-from made its checkpoint folder"
expect_fail "chat_template.jinja linked out (generate)" "outside the model folder" "$gen" --model m1 --tokens 2
cp -r hf m2 && rm m2/tokenizer.json && ln -s ../hf/tokenizer.json m2/tokenizer.json
expect_fail "tokenizer.json linked out" "m2/tokenizer.json' leads to" "$train" "${F[@]}" --init-from m2
cp -r hf m3 && rm m3/config.json && ln -s "$work/secret.txt" m3/config.json
expect_fail "config.json linked out" "m3/config.json' leads to" "$train" "${F[@]}" --init-from m3
mkdir m4 && cp hf/*.json m4/ && rm m4/config.json && cp hf/config.json m4/config.json
echo '{"weight_map": {"embed.weight": "../hf/model.safetensors"}}' > m4/model.safetensors.index.json
expect_fail "weight_map through '..'" "the weight_map's file" "$train" "${F[@]}" --init-from m4
# A Hugging Face cache: snapshots/<rev>/<file> -> ../../blobs/<hash> trains (a link to a link too).
c=cache/models--t--tiny
mkdir -p $c/blobs $c/snapshots/r1
for f in hf/*; do
  h=$(sha256sum "$f" | cut -c1-40)
  cp "$f" $c/blobs/$h && ln -s ../../blobs/$h $c/snapshots/r1/$(basename "$f")
done
ln -s r1 $c/snapshots/main
"$train" "${F[@]}" --init-from $c/snapshots/main > cache.out 2>&1 && grep -q "^step 0" cache.out && ok \
  || bad "a Hugging Face cache's links were refused: $(tail -3 cache.out)"
ln -s "$work/secret.txt" $c/snapshots/r1/chat_template.jinja
expect_fail "a cache snapshot's link out of blobs/" "outside the model folder" "$train" "${F[@]}" --init-from $c/snapshots/r1

# 2. Checkpoint folders.
expect_fail "--ckpt-dir inside a step folder" "lies inside '$work/ck/step_00000002', another run's checkpoint folder" \
  "$train" "${A[@]}" --data text.txt --steps 1 --ckpt-dir ck/step_00000002/nested
[ ! -e ck/step_00000002/nested ] && ok || bad "the refused nested folder was made"
expect_fail "--ckpt-dir inside a run's folder" "lies inside '$work/ck', another run's checkpoint folder" \
  "$train" "${A[@]}" --data text.txt --steps 1 --ckpt-dir ck/sub
[ ! -e ck/sub ] && ok || bad "the refused nested folder was made"
root_before=$(ls -a / | sort | md5sum)
had_lock=$([ -e /.lock ] && echo yes)
expect_fail "--ckpt-dir /" "is the root folder '/'" "$train" "${A[@]}" --data text.txt --steps 1 --ckpt-dir /
[ "$(ls -a / | sort | md5sum)" = "$root_before" ] && ok || {
  bad "--ckpt-dir / wrote into /: $(ls -a / | tr '\n' ' ')"
  [ -z "$had_lock" ] && grep -qs "^pid .* on host" /.lock && rm -f /.lock  # this run's own
}
cp -r hf base && before=$(ls -a base | md5sum)
expect_fail "--ckpt-dir the --init-from folder" "is the --init-from model folder" \
  "$train" "${F[@]}" --init-from base --ckpt-dir base
expect_fail "--ckpt-dir inside the --init-from folder" "is inside the --init-from model folder" \
  "$train" "${F[@]}" --init-from base --ckpt-dir base/ck
[ "$(ls -a base | md5sum)" = "$before" ] && ok || bad "a refused run changed the model folder: $(ls -a base)"
cp -r ck ow
mkdir ow/.tmp_step_00000009 && echo mine > ow/.tmp_step_00000009/notes.txt  # the user's
mkdir ow/.tmp_step_00000007 && touch ow/.tmp_step_00000007/.fsdp_checkpoint_writing  # a crashed write
"$train" "${A[@]}" --data text.txt --steps 1 --ckpt-dir ow --overwrite > ow.out 2>&1 || bad "--overwrite failed: $(tail -3 ow.out)"
[ -f ow/.tmp_step_00000009/notes.txt ] && ok || bad "--overwrite removed the user's .tmp_step_00000009"
[ ! -e ow/.tmp_step_00000007 ] && [ ! -e ow/step_00000002 ] && ok || bad "--overwrite left the project's folders: $(ls -a ow)"
expect_fail "a save over the user's .tmp_step_00000009" ".tmp_step_00000009 exists and is not a folder this project is writing" \
  "$train" "${A[@]}" --data text.txt --steps 10 --ckpt-dir ow --ckpt-every 9 --overwrite
[ -f ow/.tmp_step_00000009/notes.txt ] && ok || bad "a save removed the user's .tmp_step_00000009"

# 3. The resolved config, compared over the ranks: same flags, other --config contents.
printf 'version = 1\n[optimizer]\nlr = 0.001\n' > r0.toml
cp r0.toml r1.toml
printf 'version = 1\n[optimizer]\nlr = 0.5\n' > r1b.toml
per_rank_config() {  # per_rank_config RANK1_FILE: rank 0 reads r0.toml, rank 1 the file given
  timeout -k 10 120 python3 "$fsdprun" --standalone --nproc_per_node 2 \
    bash -c 'exec "$0" "$@" --config "$([ $RANK = 0 ] && echo r0.toml || echo '"$1"')"' \
    "$train" "${A[@]}" --data text.txt --steps 2
}
per_rank_config r1.toml > same.out 2>&1 && ok || bad "configs of the same contents at two paths were refused: $(tail -3 same.out)"
per_rank_config r1b.toml > differ.out 2>&1
rc=$?
[ $rc -ne 0 ] && grep -qF "differ from rank 0 in --lr" differ.out && grep -qF "this rank, 1, has --lr '0.5'" differ.out && ok \
  || bad "--config files of other contents: rc $rc: $(grep -m2 error differ.out)"

# 4. The process name after OpenBLAS's re-execution (FSDP_BLAS_REEXEC=2 with Prescott stands in
# for a CPU OpenBLAS does not know): every rank is fsdp-train to pgrep -x and /proc/PID/comm.
OPENBLAS_CORETYPE=Prescott FSDP_BLAS_REEXEC=2 timeout -k 10 120 python3 "$fsdprun" --standalone --nproc_per_node 2 \
  "$train" "${A[@]}" --data text.txt --steps 100000 --log-file names.jsonl > names.out 2>&1 &
job=$!
for _ in $(seq 600); do [ -s names.jsonl ] && break; sleep 0.1; done
ranks=$(pgrep -f -- "--log-file names.jsonl" | while read -r p; do
  [ "$(readlink /proc/$p/exe)" = "$(readlink -f "$train")" ] && echo $p; done)
named=$(pgrep -x fsdp-train)
n=0
for p in $ranks; do
  n=$((n + 1))
  [ "$(cat /proc/$p/comm)" = fsdp-train ] && grep -qx "$p" <<< "$named" && ok \
    || bad "rank pid $p is named '$(cat /proc/$p/comm)', not fsdp-train"
done
[ $n -eq 2 ] && ok || bad "found $n ranks, expected 2: $(tail -3 names.out)"
kill -TERM $job 2> /dev/null
wait $job

# 5. Silent results.
python3 - << 'EOF'
import json
ids = [72, 105, 33, 10] * 5
rows = [{"input_ids": ids, "labels": [-100] * 10 + ids[10:18] + [-100, -100]}] * 6
for name in ("rows.json", "rows.JSONL"):
    open(name, "w").write("".join(json.dumps(r) + "\n" for r in rows))
json.dump(rows, open("array.json", "w"), indent=1)
open("none.jsonl", "w").write("".join(json.dumps({"input_ids": r["input_ids"], "labels": [-100] * 20}) + "\n" for r in rows))
EOF
for f in rows.json rows.JSONL; do
  "$train" "${A[@]}" --data $f --steps 1 > rows.out 2>&1 && grep -q "6 tokenized rows" rows.out && ok \
    || bad "$f of tokenized rows was not read as samples: $(grep -m3 -e data -e error rows.out)"
done
expect_fail "a .json array" "is a .json file but not JSONL samples" "$train" "${A[@]}" --data array.json --steps 1
expect_fail "no target token" "no sample has a target token" "$train" "${A[@]}" --data none.jsonl --steps 1
expect_fail "--pack-eos -5" "--pack-eos must be a token id >= 0" "$train" "${A[@]}" --data text.txt --steps 1 --pack --pack-eos -5
expect_fail "--pack-eos without --pack" "--pack-eos 10 needs --pack" "$train" "${A[@]}" --data text.txt --steps 1 --pack-eos 10
expect_fail "--val-data = --data" "--val-data text.txt is the --data file" "$train" "${A[@]}" --data text.txt --val-data text.txt --eval-every 1 --steps 1
cp text.txt text2.txt && ln -s text.txt same.txt
expect_fail "--val-data a link to --data" "is the --data file" "$train" "${A[@]}" --data text.txt --val-data same.txt --eval-every 1 --steps 1
"$train" "${A[@]}" --data text.txt --val-data text2.txt --eval-every 1 --steps 1 > val.out 2>&1 && ok || bad "a --val-data copy was refused: $(tail -2 val.out)"
# put_nan STEP_DIR TENSOR: element 0 of the tensor becomes NaN; the shard's checksum and the seal
# are rewritten as a forger would, so only the values can refuse it.
put_nan() {
  python3 - "$1" "$2" << 'EOF'
import json, struct, sys
d, name = sys.argv[1], sys.argv[2]
m = json.load(open(f"{d}/metadata.json"))
for f in sorted(m["files"]):
    if not f.startswith("shard_"): continue
    b = bytearray(open(f"{d}/{f}", "rb").read())
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    if name not in h: continue
    at = 8 + n + h[name]["data_offsets"][0]
    b[at:at + 4] = struct.pack("<f", float("nan"))
    open(f"{d}/{f}", "wb").write(b)
    c = 0xcbf29ce484222325
    for x in b: c = ((c ^ x) * 0x100000001b3) % (1 << 64)
    m["files"][f]["checksum"] = f"{c:016x}"
    text = json.dumps(m, indent=1) + "\n"
    open(f"{d}/metadata.json", "w").write(text)
    c = 0xcbf29ce484222325
    for x in text.encode(): c = ((c ^ x) * 0x100000001b3) % (1 << 64)
    r = json.load(open(f"{d}/complete.json"))
    r["metadata_checksum"] = f"{c:016x}"
    open(f"{d}/complete.json", "w").write(json.dumps(r))
    sys.exit(0)
sys.exit(f"no tensor {name} in {d}")
EOF
}
cp -r ck nan && put_nan nan/step_00000002 param/layers.0.ffn.w2.weight 2> nan.err || bad "put_nan: $(cat nan.err)"
expect_fail "--resume of a NaN weight" "holds NaN" "$train" "${A[@]}" --data text.txt --steps 4 --ckpt-dir nan --resume
expect_fail "export of a NaN weight" "holds NaN" "$export_bin" --ckpt nan --out nan_out/model.safetensors
[ ! -e nan_out/model.safetensors ] && ok || bad "the refused export wrote its file"
"$train" "${F[@]}" --steps 2 --init-from hf --lora-rank 2 --ckpt-dir lora --ckpt-every 2 > lora.out 2>&1 || bad "LoRA training failed: $(tail -3 lora.out)"
put_nan lora/step_00000002 param/layers.0.attn.lora_B 2> lnan.err || bad "put_nan (LoRA): $(cat lnan.err)"
expect_fail "export --peft of a NaN adapter" "tensor 'layers.0.attn.lora_B' holds NaN" "$export_bin" --ckpt lora --peft peft
expect_fail "export --out of a NaN adapter" "tensor 'layers.0.attn.lora_B' holds NaN" "$export_bin" --ckpt lora --out merged/model.safetensors
[ ! -e peft/adapter_model.safetensors ] && [ ! -e merged/model.safetensors ] && ok || bad "a refused export wrote files"
expect_fail "--resume of a NaN adapter" "holds NaN" "$train" "${F[@]}" --steps 4 --init-from hf --lora-rank 2 --ckpt-dir lora --resume
summary
