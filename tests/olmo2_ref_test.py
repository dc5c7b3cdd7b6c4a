#!/usr/bin/env python3
"""OLMo-2 (src/models/olmo2/, its own block) against transformers' Olmo2ForCausalLM on random weights:

    olmo2_ref_test.py FSDP_BIN_DIR

  (a) an Olmo2Config of small dims with grouped-query attention (4 query heads over 2 kv heads of 16
      dims), rope theta 5e5, rms_norm_eps 1e-6, an untied head, saved by save_pretrained with every
      norm weight (the whole-width q/k norms, the norms after the attention and after the MLP, the
      final one) away from ones and every matrix from its init: fsdp-generate's f32 logits on a
      96-token prompt equal transformers' within 1e-4, and its 20 greedy tokens are transformers'
      generate(do_sample=False); the same weights with per-head q/k norms would be another model, and
      so would a norm before each sublayer (the check is not vacuous: a lost post-norm moves the
      logits by more than 1e-2);
  (b) that model fine-tuned 2 steps by fsdp-train --init-from its folder and exported by fsdp-export:
      transformers loads the folder as Olmo2ForCausalLM with no missing, unexpected or mismatched
      keys, to the checkpoint's logits within 1e-4; 2 AdamW steps moved the logits;
  (c) fsdp-export --gguf refuses it by name (llama.cpp's olmo2 is not written here);
  (d) fsdp-train at 2 ranks (mpirun; fully_shard on each OLMo-2 block) gives the 1-rank run's losses
      on the same global batch within 1e-6 relative.

PyTorch and transformers come from FSDP_TORCH_PYTHON (bench/setup_torch_ref.sh makes one), else
this interpreter; where they do not import, the test prints "skipped: ..." and exits 0 (CI does
not install PyTorch). By hand:
    FSDP_TORCH_PYTHON=/opt/torchref/bin/python ctest -R olmo2_ref -V
"""
import json
import os
import shutil
import subprocess
import sys

from torch_ref import skip, under_torch_python

under_torch_python(__file__)
try:
    import torch
    from transformers import Olmo2Config, Olmo2ForCausalLM
except ImportError as e:
    skip(f"PyTorch and transformers (with OLMo-2) do not import here ({e}); set FSDP_TORCH_PYTHON")
from family_ref import PROMPT, FamilyRef

family = FamilyRef("olmo2_ref_test", sys.argv[1])
check = family.check
ids = torch.tensor([list(PROMPT.encode())])

# (a) transformers' OLMo-2 read by fsdp-generate.
torch.manual_seed(0)
cfg = Olmo2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rope_theta=5e5, rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=0,
                  eos_token_id=1, attn_implementation="eager")
model = Olmo2ForCausalLM(cfg).eval()
with torch.no_grad():
    for n, p in model.named_parameters():
        if p.dim() == 1:
            p.uniform_(0.5, 1.5)  # norms away from ones, so that a lost or misplaced norm shows
        else:
            p.normal_(0.0, 0.2)
folder = os.path.join(family.work, "olmo2")
model.save_pretrained(folder, safe_serialization=True)
got_ids, ours = family.logits_of("--model", folder)
check(got_ids == list(PROMPT.encode()), f"the prompt's ids are not its 96 bytes: {got_ids}")
with torch.no_grad():
    ref = model(ids).logits[0]
    # The same weights with the post-attention norm left out of every block: another model.
    saved = [layer.post_attention_layernorm.forward for layer in model.model.layers]
    for layer in model.model.layers:
        layer.post_attention_layernorm.forward = lambda h: h
    apart = (model(ids).logits[0] - ref).abs().max().item()
    for layer, f in zip(model.model.layers, saved):
        layer.post_attention_layernorm.forward = f
diff = (ours - ref).abs().max().item()
print(f"(a) olmo2, GQA 4/2 of head dim 16, untied, {len(got_ids)} tokens: max |logit diff| {diff:.2e} "
      f"(logits of scale {ref.abs().max().item():.1f}); without its post-attention norms the logits "
      f"move by {apart:.2e}")
check(diff < 1e-4, f"olmo2 logits differ from transformers' by {diff}")
check(apart > 1e-2, f"the post-attention norms hardly change the logits ({apart}): the check would be vacuous")
family.greedy_tokens_equal("a", model, folder)

# (b) fine-tuned 2 steps, exported to Hugging Face, loaded by transformers as Olmo2ForCausalLM.
from_ckpt, ck, _ = family.finetune_and_export(folder, "b", gguf=None, cls="Olmo2ForCausalLM")
moved = (from_ckpt - ref).abs().max().item()
print(f"(b) 2 AdamW steps moved the logits by up to {moved:.2e}")
check(moved > 1e-3, "fine-tuning did not change the model")

# (c) no GGUF export: refused by name.
p = subprocess.run([os.path.join(family.bins, "fsdp-export"), "--ckpt", ck, "--out",
                    os.path.join(family.work, "c", "model.safetensors"), "--gguf",
                    os.path.join(family.work, "c", "model.gguf")],
                   capture_output=True, text=True, env=family.env)
print(f"(c) fsdp-export to GGUF: exit {p.returncode}: {p.stderr.strip()[-200:]}")
check(p.returncode != 0 and "the olmo2 family has no llama.cpp architecture" in p.stderr,
      f"the GGUF export of an olmo2 checkpoint was not refused by name: {p.returncode} {p.stderr[-400:]}")
# (d) sharded: fsdp-train at 2 ranks (fully_shard on each OLMo-2 block) gives the 1-rank run's
# losses on the same global batch (4 rows: 4 at 1 rank, 2 a rank at 2), to f32 reduction-order
# rounding.
if shutil.which("mpirun"):
    def losses(np_):
        log = os.path.join(family.work, f"d-{np_}.jsonl")
        mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
        if os.geteuid() == 0:
            mpirun.insert(1, "--allow-run-as-root")
        family.run(*mpirun, os.path.join(family.bins, "fsdp-train"), "--init-from", folder, "--data",
                   "/usr/share/common-licenses/Apache-2.0", "--tokenizer", "bytes", "--seq", "64", "--batch",
                   str(4 // np_), "--steps", "3", "--sample-tokens", "0", "--threads", "1", "--log-file", log)
        return [json.loads(line)["loss"] for line in open(log) if line.strip()]
    one, two = losses(1), losses(2)
    worst = max(abs(a - b) / abs(a) for a, b in zip(one, two))
    print(f"(d) 3 steps at np 1 {one}, at np 2 {two}: max relative difference {worst:.1e}")
    check(len(one) == len(two) == 3 and worst < 1e-6, f"np 2's losses {two} are not np 1's {one}")
else:
    print("(d) no mpirun: the 2-rank run is not checked")
print(f"{family.passed} passed, 0 failed")
