#!/usr/bin/env bash
# Shards are streamed, not loaded: fsdp-train at 2 ranks (mpirun) trains with
# --shuffle on a 2-billion-token corpus of llm.c shards (4 GB of uint16 tokens,
# sparse files: a valid header, then holes that read as token 0) with resident
# memory per rank (VmHWM, /usr/bin/time's maximum RSS) under 300 MB, and about
# what the same run takes on a 1-million-token corpus: memory does not grow
# with the corpus. The in-memory reader this replaced held 8 GB per rank here.
set -uo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"
export OMP_WAIT_POLICY=PASSIVE FSDP_COLLECTIVE_TIMEOUT_S=120
limit_kb=$((300 * 1024))

# shard DIR COUNT NAME: a header (magic 20240520, version 1, COUNT uint16 tokens), then a hole.
shard() {
  python3 -c "import struct,sys; h=[0]*256; h[0]=20240520; h[1]=1; h[2]=int(sys.argv[2])
open(sys.argv[1],'wb').write(struct.pack('<256i',*h)+struct.pack('<8H',1,2,3,4,5,6,7,8))" "$1/$3" "$2"
  truncate -s $((1024 + 2 * $2)) "$1/$3"
}
mkdir -p "$work/big" "$work/small"
for i in $(seq -w 0 19); do shard "$work/big" 100000000 "train_0000$i.bin"; done  # 20 x 100M tokens
shard "$work/small" 1000000 train_000000.bin
big_bytes=$(du -cb --apparent-size "$work"/big/*.bin | tail -1 | cut -f1)
[ "$big_bytes" -gt 4000000000 ] && ok || bad "the corpus is $big_bytes bytes; expected over 4 GB"

args=(--preset tiny --arch llama --vocab 256 --dim 64 --layers 2 --heads 2 --seq 64 --batch 4 --steps 4
  --lr 3e-3 --shuffle --sample-tokens 0 --threads 1 --ckpt-every 2)
# run NAME DATA: 2 ranks; each rank's maximum resident set (kB) lands in its own file,
# NAME.rss.RANK (not the shared output, where the ranks' lines can interleave), then in NAME.rss
run() {
  mpi_run -np 2 \
    sh -c 'exec /usr/bin/time -o "$0.$OMPI_COMM_WORLD_RANK" -f "%M" "$@"' "$work/$1.rss" \
    "$bin" "${args[@]}" --data "$2/train_*.bin" --ckpt-dir "$work/ck_$1" \
    > "$work/$1.out" 2>&1 || bad "$1: training failed: $(tail -5 "$work/$1.out")"
  cat "$work/$1.rss".* > "$work/$1.rss" 2> /dev/null
}
start=$(date +%s)
run big "$work/big"
run small "$work/small"
grep -q "2000000000 tokens" "$work/big.out" && ok || bad "the run table does not show 2000000000 tokens: $(grep -m1 tokens "$work/big.out")"
[ "$(grep -cE '^(\[rank0\]:)?step ' "$work/big.out")" -eq 4 ] && ok || bad "expected 4 step lines: $(tail -3 "$work/big.out")"
[ -f "$work/ck_big/step_00000004/metadata.json" ] && ok || bad "no checkpoint at step 4: $(ls "$work/ck_big")"
[ "$(wc -l < "$work/big.rss")" -eq 2 ] && ok || bad "expected 2 ranks' memory, got: $(cat "$work/big.rss")"
max_big=0
while read -r kb; do
  echo "rank resident memory on 2e9 tokens: $((kb / 1024)) MB"
  [ "$kb" -lt "$limit_kb" ] && ok || bad "a rank's resident memory is $((kb / 1024)) MB on a 2e9-token corpus; expected under 300 MB"
  [ "$kb" -gt "$max_big" ] && max_big=$kb
done < "$work/big.rss"
max_small=$(sort -n "$work/small.rss" | tail -1)
echo "rank resident memory on 1e6 tokens: $((max_small / 1024)) MB"
# 2000x the tokens: within 32 MB of the small corpus' footprint.
[ "$max_big" -lt $((max_small + 32 * 1024)) ] && ok || bad "resident memory grows with the corpus: $((max_big / 1024)) MB against $((max_small / 1024)) MB"
# --resume from step 2 reads the checkpointed data position and finishes.
rm -rf "$work/ck_big/step_00000004"
mpi_run -np 2 "$bin" "${args[@]}" --data "$work/big/train_*.bin" \
  --ckpt-dir "$work/ck_big" --resume > "$work/resume.out" 2>&1 \
  && grep -q "resume: loaded .*step_00000002 (step 2)" "$work/resume.out" && ok \
  || bad "resume on the large corpus: $(tail -3 "$work/resume.out")"

# 32-bit shards end to end: scripts/prepare_text.py with a Hugging Face tokenizer of more than
# 65536 ids writes llm.c's uint32 shards (magic 20240801, version 7) and copies the tokenizer
# beside them; fsdp-train trains on them, and refuses, by shard and position, an id past --vocab.
python3 - "$work/wide" << 'PY' || bad "could not build a 70001-id tokenizer"
import os, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
bs = [*range(33, 127), *range(161, 173), *range(174, 256)]
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}  # GPT-2's byte tokens, id = byte
vocab.update({f"\u0120\u0120x{i}": i for i in range(256, 70000)})  # unreachable fillers
tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens(["<|endoftext|>"])  # id 70000
os.makedirs(sys.argv[1]); tok.save(os.path.join(sys.argv[1], "tokenizer.json"))
PY
head -c 200 /usr/share/common-licenses/GPL-3 > "$work/wide/a.txt"  # id 70000 at token 200
head -c 3000 /usr/share/common-licenses/Apache-2.0 > "$work/wide/b.txt"
python3 "$(dirname "$0")/../scripts/prepare_text.py" "$work/wide/a.txt" "$work/wide/b.txt" --out "$work/wide/out" \
  --tokenizer "$work/wide/tokenizer.json" > "$work/prep.out" 2>&1 \
  && grep -q "uint32" "$work/prep.out" && [ -f "$work/wide/out/tokenizer.json" ] && ok \
  || bad "prepare_text --tokenizer: $(tail -3 "$work/prep.out")"
[ "$(od -A n -t d4 -N 8 "$work/wide/out/train_000000.bin" | tr -s ' ')" = " 20240801 7" ] && ok \
  || bad "a 70001-id tokenizer's shard header: $(od -A n -t d4 -N 12 "$work/wide/out/train_000000.bin")"
wide=(--preset tiny --arch llama --dim 32 --layers 1 --heads 2 --seq 32 --batch 2 --steps 2 --sample-tokens 0
  --threads 1 --data "$work/wide/out/train_*.bin")
"$bin" "${wide[@]}" --vocab 70016 --shuffle > "$work/wide.out" 2>&1 && grep -q "uint32)" "$work/wide.out" \
  && grep -q "70001 ids" "$work/wide.out" && ok || bad "training on uint32 shards: $(tail -3 "$work/wide.out")"
"$bin" "${wide[@]}" --vocab 65536 --tokenizer bytes --steps 5 > "$work/narrow.out" 2>&1 \
  && bad "ids past --vocab 65536 were accepted" \
  || { grep -q "token id 70000 at position .* is not below vocab 65536" "$work/narrow.out" && ok \
  || bad "no refusal of id 70000: $(tail -3 "$work/narrow.out")"; }
echo "took $(($(date +%s) - start)) s"
summary
