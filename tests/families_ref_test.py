#!/usr/bin/env python3
"""The model families beyond Llama and Qwen2, against transformers on random weights (issue 31):

    families_ref_test.py FSDP_BIN_DIR

  (a) Qwen3 (Qwen3Config: QK-norm, grouped-query attention of 4 query heads over 2 kv heads, a
      head dim of 32 stated apart from hidden 64 / 4 heads, rope theta 1e6, the head tied), saved
      by save_pretrained with its q/k norm weights and every matrix away from their init:
      fsdp-generate's f32 logits on a 96-token prompt equal transformers' within 1e-4, and 20
      greedy tokens are transformers' generate(do_sample=False);
  (b) that model fine-tuned 2 steps by fsdp-train --init-from its folder and exported by
      fsdp-export: transformers loads the folder as a Qwen3ForCausalLM with no missing, unexpected
      or mismatched keys, to the checkpoint's logits within 1e-4;
  (c) an untied Qwen3 of 2 query heads over 1 kv head of 128 dims: its logits within 1e-4, and
      fine-tuned, its Hugging Face export (with lm_head.weight) and its GGUF export (architecture
      qwen3, read by transformers' own GGUF loader, and by fsdp-generate through its family's
      qwen3.* keys) give the checkpoint's logits;
  (d) Llama 3's rope scaling (LlamaConfig with rope_scaling rope_type llama3, factor 32, low and
      high frequency factors 1 and 4, an original context of 32 so that 96 tokens are past it, head
      dim 64 of theta 5e5: kept, blended and divided frequencies all occur): fsdp-generate's logits
      within 1e-4 of transformers' (and the same weights without the scaling differ by more than
      1e-2, so the check is not vacuous); fine-tuned and exported, transformers loads the folder
      (rope_scaling written back) to the checkpoint's logits, the GGUF holds rope_freqs.weight as
      llama.cpp's converter computes it, and fsdp-generate reads that GGUF back to the same logits;
  (e) Gemma 3 (Gemma3TextConfig: QK-norm, (1 + w) and sandwich norms, GeGLU, the embedding scaled
      by sqrt(hidden), local layers of a sliding window of 32 and rope base 1e4 beside global ones
      of base 1e6, GQA 4/2 of head dim 32, tied): fsdp-generate's f32 logits on the 96-token prompt
      (past the window) within 1e-4 of transformers', 20 greedy tokens equal; fine-tuned 2 steps
      and exported, transformers loads it as Gemma3ForCausalLM with no missing or unexpected keys,
      to the checkpoint's logits;
  (f) Gemma 3 with llama.cpp's constants (6 layers, every 6th global, local rope base 1e4, head dim
      256 = query_pre_attn_scalar): fine-tuned and exported to GGUF (architecture gemma3, norms
      stored as 1 + w), transformers' own GGUF loader reads it as Gemma3ForCausalLM to the
      checkpoint's logits, and so does fsdp-generate;
  (g) Mistral (MistralConfig: a sliding window of 32 on every layer, GQA 4/2, head dim 16, untied):
      fsdp-generate's f32 logits on the 96-token prompt (past the window) within 1e-4 of
      transformers' (the same weights without the window differ by more than 1e-3), 20 greedy
      tokens equal; fine-tuned 2 steps and exported, transformers loads it as MistralForCausalLM
      with no missing or unexpected keys, to the checkpoint's logits.

PyTorch and transformers come from FSDP_TORCH_PYTHON (bench/setup_torch_ref.sh makes one), else
this interpreter; where they do not import, the test prints "skipped: ..." and exits 0 (CI does
not install PyTorch). By hand:
    FSDP_TORCH_PYTHON=/opt/torchref/bin/python ctest -R families_ref -V
"""
import json
import os
import sys

from torch_ref import skip, under_torch_python

under_torch_python(__file__)
try:
    import torch
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                              LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)
except ImportError as e:
    skip(f"PyTorch and transformers (with Qwen3) do not import here ({e}); set FSDP_TORCH_PYTHON")
from family_ref import PROMPT, FamilyRef

family = FamilyRef("families_ref_test", sys.argv[1])
work, gen = family.work, family.gen
run, check, logits_of = family.run, family.check, family.logits_of
finetune_and_export = family.finetune_and_export
prompt = PROMPT


def qwen3(tied, seed, heads=4, kv_heads=2, head_dim=32):
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=256, rope_theta=1e6, rms_norm_eps=1e-6,
                      tie_word_embeddings=tied)
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)  # norms away from ones, so that a lost q/k norm shows
            else:
                p.normal_(0.0, 0.2)
    return m


# (a) transformers' Qwen3 read by fsdp-generate.
model = qwen3(tied=True, seed=0)
qdir = os.path.join(work, "qwen3")
model.save_pretrained(qdir, safe_serialization=True)
ids, ours = logits_of("--model", qdir)
check(ids == list(prompt.encode()), f"the prompt's ids are not its 96 bytes: {ids}")
with torch.no_grad():
    ref = model(torch.tensor([ids])).logits[0]
diff = (ours - ref).abs().max().item()
print(f"(a) qwen3 QK-norm, GQA 4/2, head dim 32 of hidden 64, tied: {len(ids)} tokens, "
      f"max |logit diff| {diff:.2e} (logits of scale {ref.abs().max().item():.1f})")
check(diff < 1e-4, f"qwen3 logits differ from transformers' by {diff}")
family.greedy_tokens_equal("a", model, qdir)


# (b) fine-tuned, exported to Hugging Face.
from_ckpt, _, _ = finetune_and_export(qdir, "b", gguf=None)
with torch.no_grad():
    before = model(torch.tensor([list(prompt.encode())])).logits[0]
moved = (from_ckpt - before).abs().max().item()
print(f"(b) 2 AdamW steps moved the logits by up to {moved:.2e}")
check(moved > 1e-3, "fine-tuning did not change the model")

# (c) untied, 2 query heads over 1 kv head of 128 (transformers 4's GGUF loader takes Qwen3's
# head dim to be 128, whatever the file's key_length says), exported to Hugging Face and GGUF.
model = qwen3(tied=False, seed=1, heads=2, kv_heads=1, head_dim=128)
udir = os.path.join(work, "qwen3-untied")
model.save_pretrained(udir, safe_serialization=True)
_, ours = logits_of("--model", udir)
with torch.no_grad():
    ref = model(torch.tensor([list(prompt.encode())])).logits[0]
diff = (ours - ref).abs().max().item()
print(f"(c) untied qwen3, MQA 2/1, head dim 128: max |logit diff| {diff:.2e}")
check(diff < 1e-4, f"untied qwen3 logits differ by {diff}")
from_ckpt, _, hf = finetune_and_export(udir, "c", gguf="transformers")
_, from_gguf = logits_of("--model", os.path.join(hf, "model.gguf"))
diff = (from_gguf - from_ckpt).abs().max().item()
print(f"(c) fsdp-generate on the qwen3 GGUF export (its qwen3.* keys): max |logit diff| to the checkpoint {diff:.2e}")
check(diff < 1e-4, f"the qwen3 GGUF export read back differs by {diff}")

# (d) Llama 3's rope scaling.
import math

scaling = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=32)
torch.manual_seed(2)
lcfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256,
                   rope_theta=5e5, rms_norm_eps=1e-5, tie_word_embeddings=True,
                   rope_scaling=dict(scaling))  # a copy: transformers 5 adds rope_theta to it
llama = LlamaForCausalLM(lcfg).eval()
with torch.no_grad():
    for n, p in llama.named_parameters():
        if p.dim() == 2:
            p.normal_(0.0, 0.2)
ldir = os.path.join(work, "llama3")
llama.save_pretrained(ldir, safe_serialization=True)
saved = json.load(open(os.path.join(ldir, "config.json")))
# transformers 4 saves rope_scaling; transformers 5 rope_parameters (the scaling's keys and rope_theta)
print(f"(d) config.json rope_scaling {saved.get('rope_scaling')}, rope_parameters {saved.get('rope_parameters')}")
_, ours = logits_of("--model", ldir)
ids = torch.tensor([list(prompt.encode())])
with torch.no_grad():
    ref = llama(ids).logits[0]
    plain_dict = {**lcfg.to_dict(), "rope_scaling": None}
    if "rope_parameters" in plain_dict:  # transformers 5
        plain_dict["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    plain_cfg = LlamaConfig(**plain_dict)
    plain = LlamaForCausalLM(plain_cfg).eval()
    plain.load_state_dict(llama.state_dict())
    unscaled = plain(ids).logits[0]
diff = (ours - ref).abs().max().item()
apart = (unscaled - ref).abs().max().item()
print(f"(d) llama3 rope scaling x32 past an original context of 32: max |logit diff| {diff:.2e}; "
      f"without the scaling the logits move by {apart:.2e}")
check(diff < 1e-4, f"llama3-scaled logits differ from transformers' by {diff}")
check(apart > 1e-2, f"the scaling hardly changes the logits ({apart}): the check would be vacuous")
from_ckpt, ck, hf = finetune_and_export(ldir, "d", gguf="ours", cls="LlamaForCausalLM")
exported = json.load(open(os.path.join(hf, "config.json")))
check({k: exported.get("rope_scaling", {}).get(k) for k in scaling} == scaling,
      f"the export's rope_scaling {exported.get('rope_scaling')} is not {scaling}")
import gguf as gguf_py
reader = gguf_py.GGUFReader(os.path.join(hf, "model.gguf"))
freqs = [t for t in reader.tensors if t.name == "rope_freqs.weight"]
want = []  # convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors, written out
for i in range(0, 64, 2):
    freq = 1.0 / (5e5 ** (i / 64))
    wavelen = 2 * math.pi / freq
    if wavelen < 32 / 4:
        want.append(1.0)
    elif wavelen > 32 / 1:
        want.append(32.0)
    else:
        smooth = (32 / wavelen - 1) / (4 - 1)
        want.append(1 / ((1 - smooth) / 32 + smooth))
got = [float(x) for x in freqs[0].data] if freqs else []
worst = max(abs(a - b) / b for a, b in zip(got, want)) if len(got) == len(want) else float("inf")
print(f"(d) GGUF rope_freqs.weight: {len(got)} factors, {sum(1 for w in want if w == 1.0)} kept, "
      f"{sum(1 for w in want if w == 32.0)} divided, max relative difference from the converter's {worst:.1e}")
check(worst < 1e-6, f"rope_freqs.weight {got[:6]}... is not the converter's {want[:6]}...")
_, from_gguf = logits_of("--model", os.path.join(hf, "model.gguf"))
diff = (from_gguf - from_ckpt).abs().max().item()
print(f"(d) fsdp-generate on the GGUF export: max |logit diff| to the checkpoint {diff:.2e}")
check(diff < 1e-4, f"the GGUF export read back differs by {diff}")

# (e) Gemma 3 on random weights.
torch.manual_seed(3)
gcfg = Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32,
                        max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1e6, rope_local_base_freq=1e4,
                        sliding_window=32, layer_types=["sliding_attention", "full_attention"] * 2,
                        tie_word_embeddings=True, attn_implementation="eager")
gemma = Gemma3ForCausalLM(gcfg).eval()
with torch.no_grad():
    for n, p in gemma.named_parameters():
        if p.dim() == 1:
            p.uniform_(-0.5, 0.5)  # (1 + w) norms: away from their zero init
        else:
            p.normal_(0.0, 0.1)
def windowed_against_transformers(label, model, unwindowed, name, what, cls):
    """(e), (g): a model with sliding windows, read by fsdp-generate from its save_pretrained folder:
    its f32 logits on the 96-token prompt (past the window) within 1e-4 of transformers', the same
    weights without the window more than 1e-3 apart (or the check would be vacuous), 20 greedy
    tokens equal; fine-tuned and exported, it loads as `cls`."""
    folder = os.path.join(work, name)
    model.save_pretrained(folder, safe_serialization=True)
    _, ours = logits_of("--model", folder)
    unwindowed.load_state_dict(model.state_dict())
    with torch.no_grad():
        ref = model(ids).logits[0]
        apart = (unwindowed.eval()(ids).logits[0] - ref).abs().max().item()
    diff = (ours - ref).abs().max().item()
    print(f"({label}) {what}, 96 tokens: max |logit diff| {diff:.2e} (logits of scale "
          f"{ref.abs().max().item():.1f}); without the window the logits move by {apart:.2e}")
    check(diff < 1e-4, f"{name} logits differ from transformers' by {diff}")
    check(apart > 1e-3, f"the window hardly changes the logits ({apart}): the check would be vacuous")
    family.greedy_tokens_equal(label, model, folder)
    finetune_and_export(folder, label, gguf=None, cls=cls)


windowed_against_transformers(
    "e", gemma, Gemma3ForCausalLM(Gemma3TextConfig(**{**gcfg.to_dict(), "layer_types": ["full_attention"] * 4})),
    "gemma3", "gemma3, window 32 on 2 of 4 layers", "Gemma3ForCausalLM")

# (f) Gemma 3 to GGUF.
torch.manual_seed(4)
g6 = Gemma3ForCausalLM(Gemma3TextConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=2,
    num_key_value_heads=1, head_dim=256, max_position_embeddings=256, sliding_window=32,
    tie_word_embeddings=True, attn_implementation="eager")).eval()
with torch.no_grad():
    for n, p in g6.named_parameters():
        if p.dim() == 1:
            p.uniform_(-0.5, 0.5)
        else:
            p.normal_(0.0, 0.1)
g6dir = os.path.join(work, "gemma3-6")
g6.save_pretrained(g6dir, safe_serialization=True)
from_ckpt, ck, hf = finetune_and_export(g6dir, "f", gguf="transformers", cls="Gemma3ForCausalLM")
_, from_gguf = logits_of("--model", os.path.join(hf, "model.gguf"))
diff = (from_gguf - from_ckpt).abs().max().item()
print(f"(f) fsdp-generate on the gemma3 GGUF export: max |logit diff| to the checkpoint {diff:.2e}")
check(diff < 1e-4, f"the gemma3 GGUF export read back differs by {diff}")

# (g) Mistral: a sliding window on every layer.
torch.manual_seed(5)
mcfg = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1e4,
            tie_word_embeddings=False, attn_implementation="eager")
mistral = MistralForCausalLM(MistralConfig(sliding_window=32, **mcfg)).eval()
with torch.no_grad():
    for n, p in mistral.named_parameters():
        if p.dim() == 1:
            p.uniform_(0.5, 1.5)
        else:
            p.normal_(0.0, 0.2)
windowed_against_transformers("g", mistral, MistralForCausalLM(MistralConfig(sliding_window=None, **mcfg)),
                              "mistral", "mistral, window 32 on every layer", "MistralForCausalLM")
print(f"{family.passed} passed, 0 failed")
