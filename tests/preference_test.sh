#!/usr/bin/env bash
# fsdp-train --preference on TRL's standard pairs (a byte-level llama, LoRA adapters): the DPO
# losses of one global batch of 6 pairs are equal at 1, 2 and 3 ranks (1e-6 relative, full
# precision from --log-file), with pairs of very different lengths landing on different ranks;
# the loss falls; TRL's metrics (rewards/margins) agree across world sizes too; IPO and SimPO give
# 1 rank's losses at 2 ranks, ORPO (a per-microbatch NLL) 1 rank's with --grad-accum 2; and bad input is refused naming
# the file, the line and the field (a pair missing "rejected", an empty reply, a prompt longer
# than --seq), as are odd rows per rank and a frozen reference copy under --shard none. A full
# fine-tune's DPO (a frozen sharded copy as the reference) gives 1 rank's losses at 2 ranks, and
# --pref-reference puts another model in its place. --pref-precompute-ref (the reference's
# log-probs computed before training and kept in a file) gives the reference model's losses at 1
# and 2 ranks (full fine-tune, LoRA and its validation pairs, --pref-reference) with a lower peak;
# its file is read back (and by a resume), computed again when stale, refused when damaged.
set -uo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"
export OMP_WAIT_POLICY=PASSIVE FSDP_COLLECTIVE_TIMEOUT_S=120
python3 - "$work/pairs.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(12):  # replies of 8 to ~300 bytes: short and long pairs on different ranks
        long = i % 3 == 0
        chosen = f"It is {4 * i}." + " Indeed, it is." * (18 if long else 0)
        rejected = "No idea" + "!" * (40 if i % 4 == 1 else 1)
        f.write(json.dumps({"prompt": f"Q{i}: what is {i} plus {3 * i}?", "chosen": chosen,
                            "rejected": rejected}) + "\n")
PY
A=(--arch llama --vocab 256 --dim 32 --layers 2 --heads 2 --seq 96 --steps 4 --lr 1e-2
  --data "$work/pairs.jsonl" --lora-rank 4 --threads 1 --sample-tokens 0)
losses() {  # losses FILE [KEY]: a --log-file's values of KEY (loss), one a step
  python3 -c "import json,sys; [print(repr(json.loads(l)[sys.argv[2]])) for l in open(sys.argv[1]) if l.strip()]" "$1" "${2:-loss}"
}
same() {  # same NAME FILE1 FILE2 TOL
  paste "$2" "$3" | awk -v t="$4" '{d = $1 - $2; if (d < 0) d = -d; if (NF != 2 || d > t * ($1 < 0 ? -$1 : $1)) bad = 1} END {exit bad || NR == 0}' \
    && ok || bad "$1: $(paste -d' ' "$2" "$3" | tr '\n' ';')"
}
for np in 1 2 3; do
  mpi_run -np $np "$bin" "${A[@]}" --preference dpo --batch $((12 / np)) --log-file "$work/dpo$np.jsonl" \
    > "$work/dpo$np.out" 2>&1 || bad "dpo at $np ranks failed: $(tail -3 "$work/dpo$np.out")"
  losses "$work/dpo$np.jsonl" > "$work/l$np"
  losses "$work/dpo$np.jsonl" rewards/margins > "$work/m$np"
done
[ "$(wc -l < "$work/l1")" -eq 4 ] && ok || bad "1 rank logged $(wc -l < "$work/l1") steps"
awk 'NR == 1 {f = $1} END {exit !(f > 0.6931 && f < 0.6932 && $1 < f - 0.05)}' "$work/l1" && ok \
  || bad "dpo starts at log 2 (policy = reference) and falls: $(tr '\n' ' ' < "$work/l1")"
same "dpo np 2 vs 1" "$work/l1" "$work/l2" 1e-6
same "dpo np 3 vs 1" "$work/l1" "$work/l3" 1e-6
# The reference's forward (no backward) before the policy's, under fully_shard's other schedules:
# 3 microbatches of one pair a rank with the parameters kept unsharded after the forward, and
# activation checkpointing, give the same losses.
mpi_run -np 2 "$bin" "${A[@]}" --preference dpo --batch 2 --grad-accum 3 --reshard-after-forward false \
  --log-file "$work/acc.jsonl" > "$work/acc.out" 2>&1 || bad "dpo with --grad-accum 3 failed: $(tail -3 "$work/acc.out")"
mpi_run -np 2 "$bin" "${A[@]}" --preference dpo --batch 6 --activation-checkpoint full \
  --log-file "$work/ac.jsonl" > "$work/ac.out" 2>&1 || bad "dpo with checkpointing failed: $(tail -3 "$work/ac.out")"
losses "$work/acc.jsonl" > "$work/l_acc"; losses "$work/ac.jsonl" > "$work/l_ac"
same "dpo grad-accum 3, no reshard vs 1 rank" "$work/l1" "$work/l_acc" 1e-6
same "dpo activation checkpointing vs 1 rank" "$work/l1" "$work/l_ac" 1e-6
# TRL's metrics, gathered with the loss: the margins agree too (0 at the first step: policy = ref).
tail -n +2 "$work/m1" > "$work/m1t"; tail -n +2 "$work/m2" > "$work/m2t"; tail -n +2 "$work/m3" > "$work/m3t"
same "rewards/margins np 2 vs 1" "$work/m1t" "$work/m2t" 1e-6
same "rewards/margins np 3 vs 1" "$work/m1t" "$work/m3t" 1e-6
[ "$(head -1 "$work/m1")" = "0.0" ] && ok || bad "the first step's margin is $(head -1 "$work/m1"), not 0"
grep -q "rewards/accuracies [01]\.[0-9]* | rewards/margins" "$work/dpo1.out" && ok || bad "the step line has no rewards"
grep -q '"host_syncs":1,' "$work/dpo1.jsonl" && ok || bad "a DPO step waits on the device more than once"
grep -q "(12 pairs, [0-9]* tokens; 4 truncated at --seq 96 + 1" "$work/dpo1.out" && ok || bad "the table does not count the 4 long pairs truncated: $(grep "| data" "$work/dpo1.out")"
grep -q "loss .*dpo beta 0.1" "$work/dpo1.out" && ok || bad "the table does not name the loss"
for kind in ipo simpo; do
  for np in 1 2; do
    mpi_run -np $np "$bin" "${A[@]}" --preference $kind --batch $((12 / np)) --log-file "$work/$kind$np.jsonl" \
      > "$work/$kind$np.out" 2>&1 || bad "$kind at $np ranks failed: $(tail -3 "$work/$kind$np.out")"
    losses "$work/$kind$np.jsonl" > "$work/$kind.l$np"
  done
  same "$kind np 2 vs 1" "$work/$kind.l1" "$work/$kind.l2" 1e-6
done
# ORPO (no reference): its NLL term is a mean over each microbatch's chosen tokens (TRL's per
# device), so 2 ranks of 3 pairs equal 1 rank's 2 microbatches of the same 3 pairs each; the loss
# falls, and ORPO's metrics are logged.
mpi_run -np 2 "$bin" "${A[@]}" --preference orpo --batch 6 --log-file "$work/orpo2.jsonl" \
  > "$work/orpo2.out" 2>&1 || bad "orpo at 2 ranks failed: $(tail -3 "$work/orpo2.out")"
mpi_run -np 1 "$bin" "${A[@]}" --preference orpo --batch 6 --grad-accum 2 --log-file "$work/orpo1.jsonl" \
  > "$work/orpo1.out" 2>&1 || bad "orpo at 1 rank failed: $(tail -3 "$work/orpo1.out")"
losses "$work/orpo1.jsonl" > "$work/orpo.l1"; losses "$work/orpo2.jsonl" > "$work/orpo.l2"
same "orpo np 2 vs np 1 --grad-accum 2" "$work/orpo.l1" "$work/orpo.l2" 1e-6
awk 'NR == 1 {f = $1} END {exit !($1 < f - 0.05)}' "$work/orpo.l1" && ok || bad "orpo's loss does not fall: $(tr '\n' ' ' < "$work/orpo.l1")"
grep -q '"log_odds_chosen":' "$work/orpo1.jsonl" && grep -q "| nll_loss [0-9.]* | log_odds_ratio" "$work/orpo1.out" \
  && ok || bad "orpo's metrics are not logged: $(tail -1 "$work/orpo1.jsonl")"
# Validation pairs (--val-data, the first 6 pairs): the loss and TRL's metrics with its "eval_"
# prefix, log 2 before training (policy = reference), the same at 1 and 2 ranks; --eval-every
# alone holds out the last pairs of --data.
head -6 "$work/pairs.jsonl" > "$work/val.jsonl"
for np in 1 2; do
  mpi_run -np $np "$bin" "${A[@]}" --preference dpo --batch $((4 / np)) --eval-every 2 --eval-batches 3 \
    --eval-at-start --val-data "$work/val.jsonl" --log-file "$work/eval$np.jsonl" > "$work/eval$np.out" 2>&1 \
    || bad "dpo with --val-data at $np ranks failed: $(tail -3 "$work/eval$np.out")"
  python3 -c "import json,sys; [print(repr(json.loads(l)['val_loss'])) for l in open(sys.argv[1]) if 'val_loss' in l]" \
    "$work/eval$np.jsonl" > "$work/eval.l$np"
done
[ "$(wc -l < "$work/eval.l1")" -eq 2 ] && ok || bad "2 validations logged? $(cat "$work/eval.l1")"
same "validation pairs' loss np 2 vs 1" "$work/eval.l1" "$work/eval.l2" 1e-6
grep -q "^step 0 | val loss 0.6931 | eval_rewards/chosen 0.0000 .*(before training)" "$work/eval1.out" && ok \
  || bad "the validation before training is not log 2: $(grep 'step 0 | val' "$work/eval1.out")"
grep -q '"eval_rewards/accuracies":' "$work/eval1.jsonl" && ok || bad "no eval_ metrics in the log"
values() {  # values FILE KEY: KEY's values in the lines of a --log-file that have it
  python3 -c "import json,sys; [print(repr(d[sys.argv[2]])) for d in map(json.loads, open(sys.argv[1])) if sys.argv[2] in d]" "$1" "$2"
}
# LoRA (the reference: the base with the adapters off) precomputed, the validation pairs' too:
# the training's and the validation's losses are the adapters-off reference's at np 1 and 2.
for np in 1 2; do
  mpi_run -np $np "$bin" "${A[@]}" --preference dpo --batch $((4 / np)) --eval-every 2 --eval-batches 3 \
    --eval-at-start --val-data "$work/val.jsonl" --pref-precompute-ref --log-file "$work/evalp$np.jsonl" \
    > "$work/evalp$np.out" 2>&1 || bad "precomputed dpo with --val-data at $np ranks failed: $(tail -3 "$work/evalp$np.out")"
  for key in loss val_loss; do
    values "$work/evalp$np.jsonl" $key > "$work/evalp.$key$np"
    values "$work/eval1.jsonl" $key > "$work/eval.$key"
    same "lora dpo precomputed np $np vs the adapters off: $key" "$work/eval.$key" "$work/evalp.$key$np" 1e-6
  done
done
grep -q "^reference log-probs: 12 train pairs, 6 val pairs, computed" "$work/evalp2.out" && ok \
  || bad "the pass does not name the validation pairs: $(grep 'reference log' "$work/evalp2.out")"
"$bin" "${A[@]}" --preference dpo --batch 4 --steps 2 --eval-every 2 > "$work/tail.out" 2>&1 \
  && grep -q "standard pairs \[first 11\]" "$work/tail.out" && grep -q "^step 1 | val loss" "$work/tail.out" && ok \
  || bad "--eval-every without --val-data: $(grep -E 'data |val loss' "$work/tail.out")"
# A full fine-tune: the reference is a frozen sharded copy of the initial model; np 2 = np 1.
for np in 1 2; do
  mpi_run -np $np "$bin" "${A[@]}" --lora-rank 0 --lr 1e-3 --preference dpo --batch $((12 / np)) \
    --log-file "$work/full$np.jsonl" > "$work/full$np.out" 2>&1 || bad "full dpo at $np ranks failed: $(tail -3 "$work/full$np.out")"
  losses "$work/full$np.jsonl" > "$work/full.l$np"
done
same "full fine-tune dpo np 2 vs 1" "$work/full.l1" "$work/full.l2" 1e-6
awk 'NR == 1 {f = $1} END {exit !(f > 0.6931 && f < 0.6932 && $1 < f - 0.05)}' "$work/full.l1" && ok \
  || bad "full fine-tune dpo starts at log 2 and falls: $(tr '\n' ' ' < "$work/full.l1")"
grep -q "reference: a frozen sharded model" "$work/full1.out" && ok || bad "the table does not name the frozen copy"
# --pref-precompute-ref: the reference's log-probs computed in a pass before training (each rank
# its pairs, then gathered) and kept in --ckpt-dir; the training holds no reference model, so the
# allocator's peak drops, and the losses are the frozen copy's at np 1 and 2 (1e-6 relative).
peak() { sed -nE 's/^summary .*\| peak mem ([0-9.]+) MB .*/\1/p' "$1"; }
for np in 1 2; do
  mpi_run -np $np "$bin" "${A[@]}" --lora-rank 0 --lr 1e-3 --preference dpo --batch $((12 / np)) --pref-precompute-ref \
    --ckpt-dir "$work/pre$np" --log-file "$work/pre$np.jsonl" > "$work/pre$np.out" 2>&1 \
    || bad "precomputed full dpo at $np ranks failed: $(tail -3 "$work/pre$np.out")"
  losses "$work/pre$np.jsonl" > "$work/pre.l$np"
  same "full fine-tune dpo precomputed np $np vs the frozen copy" "$work/full.l1" "$work/pre.l$np" 1e-6
done
grep -q "reference: precomputed log-probs" "$work/pre1.out" \
  && grep -q "^reference log-probs: 12 train pairs, computed in .*written to $work/pre1/pref_ref_logps.json" "$work/pre1.out" \
  && ok || bad "the table or the pass's line: $(grep reference "$work/pre1.out")"
awk -v a="$(peak "$work/full1.out")" -v b="$(peak "$work/pre1.out")" 'BEGIN {exit !(b > 0 && b < a)}' && ok \
  || bad "the peak does not drop without the frozen copy: $(peak "$work/full1.out") MB -> $(peak "$work/pre1.out") MB"
cmp -s "$work/pre1/pref_ref_logps.json" "$work/pre2/pref_ref_logps.json" && ok \
  || bad "np 1 and np 2 computed different reference log-probs"
# Shuffled pairs over two epochs (each row's value goes with its pair): the frozen copy's losses.
for how in "" --pref-precompute-ref; do
  "$bin" "${A[@]}" --lora-rank 0 --lr 1e-3 --preference dpo --batch 4 --steps 8 --shuffle $how \
    --log-file "$work/shuf$how.jsonl" > "$work/shuf.out" 2>&1 || bad "shuffled dpo $how failed: $(tail -2 "$work/shuf.out")"
  losses "$work/shuf$how.jsonl" > "$work/shuf$how.l"
done
same "shuffled full fine-tune dpo precomputed vs the frozen copy" "$work/shuf.l" "$work/shuf--pref-precompute-ref.l" 1e-6
# The file is read back by a run of the same key (and a resume), computed again for another
# (--seq), refused when damaged (its checksum) or not such a file, which is left as it was.
"$bin" "${A[@]}" --lora-rank 0 --lr 1e-3 --preference dpo --batch 12 --pref-precompute-ref \
  --pref-ref-cache "$work/pre1/pref_ref_logps.json" --log-file "$work/pre3.jsonl" > "$work/pre3.out" 2>&1 \
  && grep -q "^reference log-probs: 12 train pairs, read from" "$work/pre3.out" && ok \
  || bad "the cache is not read back: $(grep -i reference "$work/pre3.out" | tail -2)"
losses "$work/pre3.jsonl" > "$work/pre.l3"
same "full fine-tune dpo from the cache vs the frozen copy" "$work/full.l1" "$work/pre.l3" 1e-6
mpi_run -np 2 "$bin" "${A[@]}" --lora-rank 0 --lr 1e-3 --preference dpo --batch 6 --pref-precompute-ref \
  --steps 2 --ckpt-dir "$work/res" --ckpt-every 2 > "$work/res1.out" 2>&1 \
  && mpi_run -np 2 "$bin" "${A[@]}" --lora-rank 0 --lr 1e-3 --preference dpo --batch 6 --pref-precompute-ref \
    --ckpt-dir "$work/res" --ckpt-every 2 --resume --log-file "$work/res.jsonl" > "$work/res2.out" 2>&1 \
  && grep -q "^reference log-probs: 12 train pairs, read from $work/res/pref_ref_logps.json" "$work/res2.out" \
  && ok || bad "a resume does not read the cache: $(tail -2 "$work/res2.out")"
losses "$work/res.jsonl" > "$work/res.l"; tail -2 "$work/full.l1" > "$work/full.tail"
same "a resumed precomputed dpo vs the frozen copy's last steps" "$work/full.tail" "$work/res.l" 1e-6
"$bin" "${A[@]}" --lora-rank 0 --preference dpo --batch 12 --steps 1 --seq 80 --pref-precompute-ref \
  --pref-ref-cache "$work/pre1/pref_ref_logps.json" > "$work/stale.out" 2>&1 \
  && grep -q "computed in .*the file held other ones: its \"seq\" was 96, this run's is 80" "$work/stale.out" && ok \
  || bad "a stale cache: $(grep -i reference "$work/stale.out" | tail -2)"
python3 - "$work/pre2/pref_ref_logps.json" "$work/pre1/pref_ref_logps.json" "$work/badkey.json" <<'PY2'
import json, sys
j = json.load(open(sys.argv[1]))
j["sets"]["train"][3] += 1e-9
open(sys.argv[1], "w").write(json.dumps(j))
j = json.load(open(sys.argv[2]))  # a damaged key is damaged, not another run's (and not replaced)
j["key"]["seq"] += 1
open(sys.argv[3], "w").write(json.dumps(j))
PY2
cp "$work/pairs.jsonl" "$work/notacache.jsonl"
truncate -s 300000000 "$work/large.bin"  # sparse: over the 256 MiB a cache may be
cp "$work/badkey.json" "$work/badkey.orig"
for f in "$work/pre2/pref_ref_logps.json:is damaged: its \"checksum\" does not match" \
         "$work/badkey.json:is damaged: its \"checksum\" does not match its key" \
         "$work/notacache.jsonl:is not JSON .*left as it is" \
         "$work/large.bin:is 300000000 bytes, more than a file of reference log-probs for 24 values"; do
  if "$bin" "${A[@]}" --lora-rank 0 --preference dpo --batch 12 --steps 1 --pref-precompute-ref \
       --pref-ref-cache "${f%%:*}" > "$work/damaged.out" 2>&1; then
    bad "--pref-ref-cache ${f%%:*} is used"
  else
    grep -qE -- "--pref-precompute-ref: ${f%%:*} ${f#*:}" "$work/damaged.out" && ok || bad "$(tail -1 "$work/damaged.out")"
  fi
done
cmp -s "$work/pairs.jsonl" "$work/notacache.jsonl" && ok || bad "a file that is not a cache was changed"
cmp -s "$work/badkey.json" "$work/badkey.orig" && ok || bad "a cache with a damaged key was changed"
# --pref-reference: two exported models, A (trained 2 steps) and B (the initial one), each the
# other's reference at lr 0 on one pair: A against A gives log 2; A against B and B against A give
# -log sigmoid(x) and -log sigmoid(-x), whose exp(-loss) add up to 1, and opposite margins.
export_bin="$(dirname "$bin")/fsdp-export"
C=(--arch llama --vocab 256 --dim 32 --layers 2 --heads 2 --seq 96 --threads 1 --sample-tokens 0
  --data "$work/pairs.jsonl" --preference simpo --batch 4)
"$bin" "${C[@]}" --steps 2 --lr 1e-2 --ckpt-dir "$work/ckA" --ckpt-every 2 > "$work/a.out" 2>&1 \
  && "$bin" "${C[@]}" --steps 1 --lr 0 --ckpt-dir "$work/ckB" --ckpt-every 1 > "$work/b.out" 2>&1 \
  && "$export_bin" --ckpt "$work/ckA" --out "$work/A/model.safetensors" > "$work/ea.out" 2>&1 \
  && "$export_bin" --ckpt "$work/ckB" --out "$work/B/model.safetensors" > "$work/eb.out" 2>&1 \
  || bad "making the two reference models failed: $(tail -2 "$work"/{a,b,ea,eb}.out)"
for pr in AA AB BA; do
  "$bin" "${C[@]}" --tokenizer bytes --init-from "$work/${pr:0:1}" --pref-reference "$work/${pr:1:1}" \
    --preference dpo --lora-rank 4 --steps 1 --lr 0 --batch 2 --log-file "$work/$pr.jsonl" > "$work/$pr.out" 2>&1 \
    || bad "--pref-reference $pr failed: $(tail -3 "$work/$pr.out")"
done
python3 - "$work" <<'PY' && ok || bad "--pref-reference: the losses and margins of A|A, A|B, B|A do not agree"
import json, math, sys
d = {p: json.loads(open(f"{sys.argv[1]}/{p}.jsonl").read().splitlines()[-1]) for p in ("AA", "AB", "BA")}
print({p: (v["loss"], v["rewards/margins"]) for p, v in d.items()})
assert abs(d["AA"]["loss"] - math.log(2)) < 1e-12 and d["AA"]["rewards/margins"] == 0
assert abs(math.exp(-d["AB"]["loss"]) + math.exp(-d["BA"]["loss"]) - 1) < 1e-9
assert abs(d["AB"]["rewards/margins"] + d["BA"]["rewards/margins"]) < 1e-9 and abs(d["AB"]["rewards/margins"]) > 1e-3
PY
grep -q "reference: a frozen sharded model" "$work/AB.out" && ok || bad "the table does not name the reference model"
# --pref-precompute-ref with --pref-reference: the pass builds the other model, then frees it; the
# loss and margins are the frozen model's.
"$bin" "${C[@]}" --tokenizer bytes --init-from "$work/A" --pref-reference "$work/B" --pref-precompute-ref \
  --preference dpo --lora-rank 4 --steps 1 --lr 0 --batch 2 --log-file "$work/ABp.jsonl" > "$work/ABp.out" 2>&1 \
  || bad "--pref-reference precomputed failed: $(tail -3 "$work/ABp.out")"
for key in loss rewards/margins; do
  losses "$work/AB.jsonl" $key > "$work/ab.$$"; losses "$work/ABp.jsonl" $key > "$work/abp.$$"
  same "--pref-reference precomputed vs frozen: $key" "$work/ab.$$" "$work/abp.$$" 1e-6
done
# A short --seq truncates the long pairs (at their end, TRL's keep_start) and counts them.
"$bin" "${A[@]}" --preference dpo --batch 4 --steps 1 --seq 40 > "$work/cut.out" 2>&1 \
  || bad "a short --seq failed: $(tail -3 "$work/cut.out")"
grep -q "; 6 truncated at --seq 40" "$work/cut.out" && ok || bad "no truncated pairs counted: $(grep data "$work/cut.out")"

refused() {  # refused NAME PATTERN ARGS...: exits non-zero with the message
  local name=$1 pattern=$2
  shift 2
  if timeout 60 "$bin" "$@" > "$work/r.out" 2>&1; then
    bad "$name: accepted"
  else
    grep -qE -- "$pattern" "$work/r.out" && ok || bad "$name: $(tail -2 "$work/r.out")"
  fi
}
B=(--arch llama --vocab 256 --dim 32 --layers 2 --heads 2 --seq 32 --steps 1 --batch 2 --lora-rank 4
  --threads 1 --sample-tokens 0 --preference dpo)
printf '%s\n' '{"prompt": "a", "chosen": "b", "rejected": "c"}' '{"prompt": "a", "chosen": "b"}' > "$work/norej.jsonl"
refused "missing rejected" "norej.jsonl:2: no \"rejected\"" "${B[@]}" --data "$work/norej.jsonl"
printf '%s\n' '{"prompt": "a", "chosen": "", "rejected": "c"}' > "$work/empty.jsonl"
refused "empty reply" "empty.jsonl:1: \"chosen\" is an empty string" "${B[@]}" --data "$work/empty.jsonl"
python3 -c "import json; print(json.dumps({'prompt': 'x' * 50, 'chosen': 'b', 'rejected': 'c'}))" > "$work/long.jsonl"
refused "long prompt" "long.jsonl:1: \"prompt\" is 50 tokens, longer than --seq 32" "${B[@]}" --data "$work/long.jsonl"
# TRL's keep_end keeps the sequence's end instead: the long prompt trains, its start cut.
"$bin" "${B[@]}" --data "$work/long.jsonl" --pref-truncation keep_end > "$work/keepend.out" 2>&1 \
  && grep -q "1 truncated at --seq 32 + 1 keeping their ends" "$work/keepend.out" && ok \
  || bad "--pref-truncation keep_end: $(tail -2 "$work/keepend.out")"
refused "a bad --pref-truncation" "--pref-truncation must be keep_start or keep_end, got 'middle'" \
  "${B[@]}" --data "$work/pairs.jsonl" --pref-truncation middle
refused "odd rows per rank" "--batch 3 rows per rank with --preference" "${B[@]}" --batch 3 --data "$work/pairs.jsonl"
refused "a frozen reference copy unsharded" "--preference dpo with --pref-reference or without --lora-rank keeps a frozen sharded model" \
  "${B[@]}" --lora-rank 0 --shard none --data "$work/pairs.jsonl"
"$bin" "${B[@]}" --lora-rank 0 --shard none --pref-precompute-ref --data "$work/pairs.jsonl" > "$work/none.out" 2>&1 \
  && ok || bad "precomputed log-probs under --shard none (no frozen copy needed): $(tail -2 "$work/none.out")"
refused "--pref-precompute-ref with simpo" "--pref-precompute-ref computes the reference log-probs of --preference dpo or ipo" \
  "${B[@]}" --preference simpo --pref-precompute-ref --data "$work/pairs.jsonl"
refused "--pref-ref-cache alone" "--pref-ref-cache x.json is the file of --pref-precompute-ref" \
  "${B[@]}" --pref-ref-cache x.json --data "$work/pairs.jsonl"
refused "an unwritable --pref-ref-cache" "--pref-precompute-ref: cannot write .*pairs.jsonl/ref.json: .*Not a directory" \
  "${A[@]}" --lora-rank 0 --preference dpo --batch 12 --steps 1 --pref-precompute-ref --pref-ref-cache "$work/pairs.jsonl/ref.json"
refused "pairs without --preference" "holds preference pairs" --arch llama --vocab 256 --steps 1 --data "$work/pairs.jsonl"
printf 'plain text, not pairs\n' > "$work/plain.txt"
refused "text as validation pairs" "--val-data .*plain.txt with --preference: expected a .jsonl of preference pairs" \
  "${B[@]}" --eval-every 2 --val-data "$work/plain.txt" --data "$work/pairs.jsonl"
refused "--pref-reference with simpo" "--pref-reference base is the reference model of --preference dpo or ipo" \
  "${B[@]}" --preference simpo --pref-reference base --data "$work/pairs.jsonl"
refused "--pref-reference of another shape" "--pref-reference .*/B: its shape differs" "${B[@]}" --dim 64 \
  --pref-reference "$work/B" --data "$work/pairs.jsonl"
# Pairs are recognized by a .jsonl's first line parsing as an object with "chosen" or "rejected",
# not by the words: a text whose first line quotes them trains as text.
python3 -c "print('He said \"chosen\" and \"rejected\" out loud. ' * 40)" > "$work/quotes.txt"
"$bin" --arch llama --vocab 256 --dim 32 --layers 2 --heads 2 --seq 16 --batch 2 --steps 1 --threads 1 \
  --sample-tokens 0 --data "$work/quotes.txt" > "$work/quotes.out" 2>&1 \
  && ok || bad "a text quoting \"chosen\" is refused: $(tail -2 "$work/quotes.out")"
summary
