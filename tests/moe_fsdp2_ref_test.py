#!/usr/bin/env python3
"""fsdp-train against PyTorch FSDP2 on a mixture of experts (issue 51):

    moe_fsdp2_ref_test.py FSDP_BIN_DIR SOURCE_DIR

transformers' own random Qwen3MoeForCausalLM (its initialization, seeded; 8 experts, top 2,
norm_topk_prob, one dense layer via mlp_only_layers [0] before two MoE layers, GQA 4/2 of head dim
16, QK-norm, untied, router_aux_loss_coef 0.02), saved by save_pretrained, trained 3 AdamW steps at
2 ranks over gloo by
  - PyTorch FSDP2: bench/moe_fsdp2_ref.py under torchrun (fully_shard on every decoder layer and
    the root, output_router_logits=True, the load-balancing loss with the global batch's router
    statistics as fsdp-train has them; see that script), and
  - fsdp-train --init-from the folder under scripts/fsdprun (gloo),
on the same token windows (4 rows of 32 tokens a step, 2 a rank), with the same lr 1e-3, betas
(0.9, 0.95), eps 1e-7, weight decay 0.1 on every parameter and clipping to the global norm 1.0 (the
gradients' norm is above it: the clipping acts). Checks: each step's loss (cross-entropy plus 0.02
x the load-balancing loss, the mean over the ranks) and gradient norm equal PyTorch's within 1e-4
relative; the reference's aux formula is transformers' out.aux_loss on each rank's own rows (the
script checks it every step).

PyTorch and transformers come from FSDP_TORCH_PYTHON, else this interpreter; where they do not
import, the test prints "skipped: ..." and exits 0 (CI does not install PyTorch). By hand:
    FSDP_TORCH_PYTHON=/opt/torchref/bin/python ctest -R moe_fsdp2_ref -V
"""
import json
import os
import re
import shutil
import sys
import tempfile

from torch_ref import Checks, skip, under_torch_python

under_torch_python(__file__)
try:
    import torch
    import torch.distributed as dist
    from transformers import Qwen3MoeForCausalLM  # noqa: F401  (transformers 4.51 or later)
except ImportError as e:
    skip(f"PyTorch and transformers (with Qwen3-MoE) do not import here ({e}); set FSDP_TORCH_PYTHON")
if not dist.is_available() or not dist.is_gloo_available():
    skip("this PyTorch has no gloo backend")

bins, src = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1")
c = Checks("moe_fsdp2_ref_test", env)
ref = os.path.join(src, "bench", "moe_fsdp2_ref.py")
model, shard = os.path.join(work, "qwen3_moe"), os.path.join(work, "tokens.bin")
STEPS, BATCH, SEQ = 3, 2, 32  # BATCH rows per rank
hyper = ["--steps", str(STEPS), "--batch", str(BATCH), "--seq", str(SEQ), "--lr", "1e-3", "--beta1", "0.9",
         "--beta2", "0.95", "--eps", "1e-7", "--weight-decay", "0.1", "--grad-clip", "1.0"]

# The model (the script's defaults are this test's) and 8192 random bytes as the data.
print(c.run(sys.executable, ref, "--make", model, "--seed", "0").strip())
print(c.run(sys.executable, ref, "--tokens", shard, "--vocab", "256", "--count", "8192").strip())

# PyTorch FSDP2, 2 ranks.
out = c.run(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", ref,
            "--train", model, "--data", shard, "--threads", "1", *hyper)
m = re.search(r"torch-ref losses: (.*)", out)
c.check(m is not None, f"no losses in the reference's output: {out[-800:]}")
theirs = json.loads(m.group(1))
their_norms = [float(x) for x in re.findall(r"grad norm ([0-9.]+)", out)]
per_rank = [float(x) for x in re.findall(r"per-rank aux ([0-9.]+)", out)]
c.check(len(theirs) == STEPS and len(their_norms) == STEPS, f"the reference ran {len(theirs)} steps: {out[-800:]}")

# fsdp-train, 2 ranks over gloo.
log = os.path.join(work, "ours.jsonl")
table = c.run(sys.executable, os.path.join(src, "scripts", "fsdprun"), "--standalone", "--nproc_per_node", "2",
              os.path.join(bins, "fsdp-train"), "--init-from", model, "--data", shard, "--threads", "1",
              "--sample-tokens", "0", "--log-file", log, *hyper)
c.check(re.search(r"world size +\| 2 \(gloo", table) is not None, f"fsdp-train did not run 2 ranks over gloo: {table[-800:]}")
rows = [json.loads(line) for line in open(log) if line.strip()]
ours, our_norms = [r["loss"] for r in rows], [r["grad_norm"] for r in rows]
c.check(len(ours) == STEPS, f"fsdp-train logged {len(ours)} steps, not {STEPS}")

rel = [abs(a - b) / abs(b) for a, b in zip(ours, theirs)]
rel_norm = [abs(a - b) / abs(b) for a, b in zip(our_norms, their_norms)]
off = [abs(a - b) / abs(b) for a, b in zip(ours, per_rank)]
print("step | fsdp-train loss | PyTorch FSDP2 loss | rel | grad norm ours / theirs | per-rank-aux loss, rel to ours")
for s in range(STEPS):
    print(f"{s} | {ours[s]:.9f} | {theirs[s]:.9f} | {rel[s]:.1e} | {our_norms[s]:.6f} / {their_norms[s]:.6f} | "
          f"{per_rank[s]:.9f}, {off[s]:.1e}")
c.check(max(rel) < 1e-4, f"the losses differ from PyTorch FSDP2's by {max(rel):.2e} relative (ours {ours}, "
        f"theirs {theirs})")
c.check(min(their_norms) > 1.0, f"the gradient norms {their_norms} do not reach the clipping norm 1.0")
c.check(max(rel_norm) < 1e-4, f"the gradient norms differ by {max(rel_norm):.2e} relative ({our_norms} vs {their_norms})")

shutil.rmtree(work, ignore_errors=True)
print(f"moe_fsdp2_ref_test: {c.passed} checks passed")
