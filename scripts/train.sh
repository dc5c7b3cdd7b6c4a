#!/usr/bin/env bash
# The main command: trains a tiny llama-architecture MiniLLM on this CPU on
# real text (the license texts under /usr/share/common-licenses, read as
# bytes) with 2 ranks under mpirun, saves sharded checkpoints, exports the
# last one to safetensors (Hugging Face names) and GGUF, samples text from
# the export, and plots the loss into build/loss.png. Installs missing dependencies and builds first. Extra
# arguments go to fsdp-train and override the defaults below (for example:
# scripts/train.sh --steps 200); --resume continues the previous run.
#
# The llama architecture is used because the reference (seed) architecture
# attends in both directions without a mask: on text it can read the very
# token it is asked to predict.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh fsdp-train fsdp-export fsdp-generate
build=${FSDP_BUILD_DIR:-build}
mkdir -p "$build/data"
text="$build/data/licenses.txt"
[ -s "$text" ] || cat /usr/share/common-licenses/* > "$text"
ckpt="$build/ckpt/tiny-llama"
if [[ " $* " != *" --resume "* ]]; then
  rm -rf "$ckpt"  # a fresh run; pass --resume to continue the last one instead
fi
root=()
[ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
export OMP_WAIT_POLICY=PASSIVE
echo "== training a byte-level model (3.5 M parameters) from nothing for 60 steps at 2 ranks. Expect the"
echo "   validation loss to fall from about 5.8 nats a byte (ln 256 = 5.55 is a guess) to about 2.5, and text"
echo "   in the shape of a license at the end (word-like runs, spaces, punctuation), not sentences."
start=()
[[ " $* " == *" --resume "* ]] || start=(--eval-at-start)
mpirun "${root[@]}" --oversubscribe --bind-to none -np 2 "$build/examples/fsdp-train" \
  --preset tiny --arch llama --vocab 256 --batch 4 --steps 60 \
  --lr 2e-3 --warmup-steps 5 --lr-decay cosine --min-lr 2e-4 --wd-2d-only --grad-clip 1.0 \
  --data "$text" --eval-every 20 "${start[@]}" --ckpt-dir "$ckpt" --ckpt-every 20 --keep 2 \
  --log-file "$build/train.jsonl" --sample-tokens 0 "$@" | tee "$build/train.log"
val=$(sed -n 's/^step \([0-9]*\) | val loss \([0-9.]*\).*/\1 \2/p' "$build/train.log")
[ -z "$val" ] || echo "== validation loss: $(head -1 <<< "$val" | awk '{print $2 " at step " $1}') -> $(tail -1 <<< "$val" | awk '{print $2 " after step " $1}')"
"$build/examples/fsdp-export" --ckpt "$ckpt" --out "$build/export/model.safetensors" --gguf "$build/export/model.gguf"
"$build/examples/fsdp-generate" --model "$build/export/model.safetensors" --prompt "The " --tokens 200
python3 scripts/plot_loss.py "$build/train.jsonl" --out "$build/loss.png"  # the train and val curves
