#!/usr/bin/env bash
# Trains the tiny MiniLLM on this CPU on real text: the license texts under
# /usr/share/common-licenses, read as bytes. Installs missing dependencies and
# builds fsdp-train first. Extra arguments go to fsdp-train and override the
# defaults below (for example: scripts/train.sh --steps 200).
#
# The llama architecture is used because the reference (seed) architecture
# attends in both directions without a mask: on text it can read the very
# token it is asked to predict.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh fsdp-train
build=${FSDP_BUILD_DIR:-build}
mkdir -p "$build/data"
text="$build/data/licenses.txt"
[ -s "$text" ] || cat /usr/share/common-licenses/* > "$text"
exec "$build/examples/fsdp-train" --preset tiny --arch llama --vocab 256 --steps 50 --lr 1e-3 --data "$text" "$@"
