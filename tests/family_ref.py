"""What the tests of model families against transformers share (families_ref_test, olmo2_ref_test):
a 96-byte prompt (the bytes tokenizer gives 96 ids), fsdp-generate's f32 logits on it and its 20
greedy tokens against transformers' generate, and a model fine-tuned 2 steps by fsdp-train
--init-from its folder, exported by fsdp-export and loaded back by transformers. Import it after
torch_ref.under_torch_python: its methods import torch and transformers."""
import json
import os
import subprocess
import tempfile

from torch_ref import failer

# 96 bytes: the bytes tokenizer gives 96 ids.
PROMPT = "Queries and keys are normalized per head before their rotation; 96 bytes make the prompt longer."
assert len(PROMPT.encode()) == 96, len(PROMPT.encode())


class FamilyRef:
    """The binaries in `bins`, a scratch folder (`work`) and the checks of the test `name`: a failed
    check, or a command that exits non-zero (its stderr's tail), prints the FAIL line and exits 1;
    `passed` counts the checks."""

    def __init__(self, name, bins):
        self.fail = failer(name)
        self.bins = bins
        self.work = tempfile.mkdtemp()
        self.env = dict(os.environ, OMP_NUM_THREADS="2")
        self.gen = os.path.join(bins, "fsdp-generate")
        self.passed = 0

    def run(self, *args, raw=False):
        p = subprocess.run(list(args), capture_output=True, env=self.env)
        if p.returncode:
            self.fail(f"{' '.join(args[:3])} ...: {p.stderr.decode(errors='replace').strip()[-600:]}")
        return p.stdout if raw else p.stdout.decode(errors="replace")

    def check(self, ok, what):
        if not ok:
            self.fail(what)
        self.passed += 1

    def logits_of(self, *source):
        """fsdp-generate's prompt ids and f32 logits of PROMPT, the model given by `source`
        ("--model", folder or "--ckpt", checkpoint)."""
        import torch
        j = json.loads(self.run(self.gen, *source, "--tokenizer", "bytes", "--prompt", PROMPT,
                                "--print-logits", "--threads", "2"))
        return j.get("ids", j.get("prompt_ids")), torch.tensor(j["logits"])

    def greedy_tokens_equal(self, label, model, folder):
        """20 greedy tokens after PROMPT: transformers' generate(do_sample=False) of `model` and
        fsdp-generate's of its saved `folder`."""
        import torch
        ids = torch.tensor([list(PROMPT.encode())])
        with torch.no_grad():
            want_ids = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20,
                                      do_sample=False, pad_token_id=0)[0][ids.shape[1]:].tolist()
        text = self.run(self.gen, "--model", folder, "--tokenizer", "bytes", "--prompt", PROMPT,
                        "--tokens", "20", "--temperature", "0", "--ignore-eos", "--threads", "2", raw=True)
        print(f"({label}) greedy 20 tokens: transformers {want_ids}")
        self.check(bytes(want_ids) in text,
                   f"({label}) greedy bytes differ: fsdp-generate {text!r}, transformers {bytes(want_ids)!r}")

    def finetune_and_export(self, src, name, gguf, cls="Qwen3ForCausalLM"):
        """The model in folder `src` fine-tuned 2 steps and exported to Hugging Face (and to GGUF
        where `gguf` says: "ours" or "transformers", which also reads it back): transformers loads
        the export as `cls` with no missing, unexpected or mismatched keys, to the checkpoint's
        logits within 1e-4. Returns the checkpoint's logits, its folder and the export's."""
        import torch
        from transformers import AutoModelForCausalLM
        ck = os.path.join(self.work, name + "-ck")
        self.run(os.path.join(self.bins, "fsdp-train"), "--init-from", src, "--data",
                 "/usr/share/common-licenses/Apache-2.0", "--tokenizer", "bytes", "--seq", "64", "--batch", "2",
                 "--steps", "2", "--sample-tokens", "0", "--ckpt-dir", ck, "--ckpt-every", "2", "--threads", "2")
        hf = os.path.join(self.work, name + "-export")
        self.run(os.path.join(self.bins, "fsdp-export"), "--ckpt", ck, "--out", os.path.join(hf, "model.safetensors"),
                 *(["--gguf", os.path.join(hf, "model.gguf")] if gguf else []))
        loaded, info = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, output_loading_info=True)
        keys = {k: info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        print(f"({name}) transformers loads the fine-tuned export as {type(loaded).__name__}: {keys}")
        self.check(not any(keys.values()) and not info.get("error_msgs") and type(loaded).__name__ == cls,
                   f"loading the {name} export: {type(loaded).__name__} {info}")
        _, from_ckpt = self.logits_of("--ckpt", ck)
        with torch.no_grad():
            ref = loaded.eval()(torch.tensor([list(PROMPT.encode())])).logits[0]
        diff = (from_ckpt - ref).abs().max().item()
        print(f"({name}) fine-tuned: max |logit diff| checkpoint vs export in transformers {diff:.2e}")
        self.check(diff < 1e-4, f"the fine-tuned {name} export's logits differ by {diff}")
        if gguf == "transformers":
            g = AutoModelForCausalLM.from_pretrained(hf, gguf_file="model.gguf", dtype=torch.float32)
            with torch.no_grad():
                ref = g.eval()(torch.tensor([list(PROMPT.encode())])).logits[0]
            diff = (from_ckpt - ref).abs().max().item()
            print(f"({name}) the GGUF export read by transformers' GGUF loader as {type(g).__name__} "
                  f"(architecture {g.config.model_type}): max |logit diff| {diff:.2e}")
            self.check(type(g).__name__ == cls and diff < 1e-4,
                       f"the GGUF export: {type(g).__name__}, diff {diff}")
        return from_ckpt, ck, hf
