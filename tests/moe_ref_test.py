#!/usr/bin/env python3
"""The mixture-of-experts families against transformers on random weights (issue 51):

    moe_ref_test.py FSDP_BIN_DIR

qwen3_moe: a Qwen3MoeForCausalLM of 8 experts, top 2 (norm_topk_prob), one dense layer
(mlp_only_layers [0]) before two MoE layers, GQA 4/2 of head dim 16, QK-norm, untied; mixtral: a
MixtralForCausalLM of 4 experts, top 2, in each of 2 layers, GQA 4/2. Both with output_router_logits
and a load-balancing coefficient of 0.02, saved by transformers with every weight away from its
init; for each:
  (a) fsdp-generate's f32 logits on a 96-token prompt equal transformers' within 1e-4, and its 20
      greedy tokens are transformers' generate(do_sample=False);
  (b) fsdp-train --init-from that folder: its first loss (cross-entropy plus 0.02 x the router's
      load-balancing loss, nn::MoE's) equals transformers' loss with output_router_logits=True on
      the same rows within 1e-5 relative;
  (c) the same run at 2 ranks (mpirun, fully_shard: the experts' stacked weights sharded by
      expert; the router's statistics summed over the ranks) gives the losses of 1 rank, 3 steps,
      within 1e-5 relative;
  (d) fine-tuned and exported by fsdp-export, transformers loads the folder as Qwen3MoeForCausalLM
      with no missing, unexpected or mismatched keys, to the checkpoint's logits within 1e-4.

PyTorch and transformers come from FSDP_TORCH_PYTHON, else this interpreter; where they do not
import, the test prints "skipped: ..." and exits 0 (CI does not install PyTorch). By hand:
    FSDP_TORCH_PYTHON=/opt/torchref/bin/python ctest -R moe_ref -V
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from torch_ref import failer, skip, under_torch_python

fail = failer("moe_ref_test")
under_torch_python(__file__)
try:
    import numpy as np
    import torch
    from transformers import (AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,
                              Qwen3MoeForCausalLM)
except ImportError as e:
    skip(f"PyTorch and transformers (with Qwen3-MoE) do not import here ({e}); set FSDP_TORCH_PYTHON")

bins = sys.argv[1]
work = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1")
gen = os.path.join(bins, "fsdp-generate")
train = os.path.join(bins, "fsdp-train")
passed = 0


def run(*args, raw=False):
    p = subprocess.run(list(args), capture_output=True, env=env)
    if p.returncode:
        fail(f"{' '.join(args[:3])} ...: {p.stderr.decode(errors='replace').strip()[-800:]}")
    return p.stdout if raw else p.stdout.decode(errors="replace")


def check(ok, what):
    global passed
    if not ok:
        fail(what)
    passed += 1


prompt = "Each token goes to two of eight experts; the router's softmax picks them, then they mix."
prompt = (prompt + " " * 96)[:96]
assert len(prompt.encode()) == 96


def logits_of(*source):
    j = json.loads(run(gen, *source, "--tokenizer", "bytes", "--prompt", prompt, "--print-logits",
                       "--threads", "1"))
    return j.get("ids", j.get("prompt_ids")), torch.tensor(j["logits"])


# The training rows: a token shard (llm.c's format) read unshuffled:
# step s, row r starts at ((s * rows + r) * seq) % n.
rng = np.random.default_rng(3)
tokens = rng.integers(0, 256, size=4096)
shard = os.path.join(work, "tokens.bin")
header = np.zeros(256, dtype="<i4")
header[:3] = (20240520, 1, tokens.size)
with open(shard, "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.astype("<u2").tobytes())
SEQ, ROWS, STEPS = 32, 4, 3


def batch(step):
    rows = np.stack([tokens[((step * ROWS + r) * SEQ + np.arange(SEQ + 1)) % tokens.size]
                     for r in range(ROWS)])
    return torch.tensor(rows[:, :-1]), torch.tensor(rows[:, 1:])


def train_losses(qdir, np_, name):
    log = os.path.join(work, name + ".jsonl")
    ck = os.path.join(work, name + "-ck")
    mpi = []
    if np_ > 1:
        mpi = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
        if os.geteuid() == 0:
            mpi.insert(1, "--allow-run-as-root")
    run(*mpi, train, "--init-from", qdir, "--data", shard, "--seq", str(SEQ),
        "--batch", str(ROWS // np_), "--steps", str(STEPS), "--sample-tokens", "0", "--lr", "1e-3",
        "--threads", "1", "--log-file", log, "--ckpt-dir", ck, "--ckpt-every", str(STEPS))
    return [json.loads(line)["loss"] for line in open(log) if line.strip()], ck


def randomized(model):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.2)
    return model.eval()


def check_family(name, model, cls):
    qdir = os.path.join(work, name)
    model.save_pretrained(qdir, safe_serialization=True)

    # (a) logits and greedy tokens.
    ids, ours = logits_of("--model", qdir)
    check(ids == list(prompt.encode()), f"the prompt's ids are not its 96 bytes: {ids}")
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    diff = (ours - ref).abs().max().item()
    print(f"(a) {name}: {len(ids)} tokens, max |logit diff| {diff:.2e} (logits of scale "
          f"{ref.abs().max().item():.1f})")
    check(diff < 1e-4, f"{name} logits differ from transformers' by {diff}")
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=20, do_sample=False, pad_token_id=0,
                              output_router_logits=False)[0][len(ids):].tolist()
    text = run(gen, "--model", qdir, "--tokenizer", "bytes", "--prompt", prompt, "--tokens", "20",
               "--temperature", "0", "--ignore-eos", "--threads", "1", raw=True)
    print(f"(a) greedy 20 tokens: transformers {want}")
    check(bytes(want) in text, f"greedy bytes differ: fsdp-generate {text!r}, transformers {bytes(want)!r}")

    # (b) the first loss, router loss included.
    losses1, ck = train_losses(qdir, 1, name + "-np1")
    inputs, targets = batch(0)
    with torch.no_grad():
        out = model(inputs, labels=targets, shift_labels=targets, output_router_logits=True)
    theirs = out.loss.item()
    ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 256), targets.reshape(-1)).item()
    rel = abs(losses1[0] - theirs) / abs(theirs)
    print(f"(b) first loss: fsdp-train {losses1[0]:.7f}, transformers {theirs:.7f} (cross-entropy "
          f"{ce:.7f} + 0.02 x aux {out.aux_loss.item():.5f}), rel {rel:.1e}")
    check(abs(theirs - ce - 0.02 * out.aux_loss.item()) < 1e-6 and out.aux_loss.item() > 1,
          "transformers' loss is not its cross-entropy plus the router loss")
    check(rel < 1e-5, f"the first loss differs from transformers' by {rel:.2e} relative")

    # (c) 2 ranks: the losses of 1.
    losses2, _ = train_losses(qdir, 2, name + "-np2")
    worst = max(abs(a - b) / abs(a) for a, b in zip(losses1, losses2))
    print(f"(c) losses at np 1 {losses1}, at np 2 {losses2}: worst rel {worst:.1e}")
    check(len(losses2) == STEPS and worst < 1e-5, f"np 2's losses differ from np 1's by {worst:.2e}")

    # (d) exported, read by transformers.
    hf = os.path.join(work, name + "-export")
    run(os.path.join(bins, "fsdp-export"), "--ckpt", ck, "--out", os.path.join(hf, "model.safetensors"))
    loaded, info = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, output_loading_info=True)
    keys = {k: info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    print(f"(d) transformers loads the fine-tuned export as {type(loaded).__name__}: {keys}")
    check(not any(keys.values()) and type(loaded).__name__ == cls,
          f"loading the export: {type(loaded).__name__} {info}")
    _, from_ckpt = logits_of("--ckpt", ck)
    with torch.no_grad():
        ref = loaded.eval()(torch.tensor([list(prompt.encode())])).logits[0]
    diff = (from_ckpt - ref).abs().max().item()
    moved = (from_ckpt - ours).abs().max().item()
    print(f"(d) fine-tuned ({moved:.2e} moved): max |logit diff| checkpoint vs export in transformers {diff:.2e}")
    check(moved > 1e-3 and diff < 1e-4, f"the export's logits differ by {diff} (moved {moved})")


torch.manual_seed(0)
check_family("qwen3_moe", randomized(Qwen3MoeForCausalLM(Qwen3MoeConfig(
    vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=1e6, rms_norm_eps=1e-6,
    tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0], output_router_logits=True,
    router_aux_loss_coef=0.02))), "Qwen3MoeForCausalLM")
torch.manual_seed(1)
check_family("mixtral", randomized(MixtralForCausalLM(MixtralConfig(
    vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, rope_theta=1e6, rms_norm_eps=1e-5,
    tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
    router_aux_loss_coef=0.02))), "MixtralForCausalLM")

shutil.rmtree(work, ignore_errors=True)
print(f"moe_ref_test: {passed} checks passed")
