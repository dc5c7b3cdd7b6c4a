#!/usr/bin/env python3
"""fsdp-train on a Qwen3-MoE folder written here (moe_folder.py: random f32 weights, no torch; 4
experts, top 2, its second layer dense (mlp_only_layers [1]), GQA and QK-norm).

    moe_cli_test.py FSDP_BIN_DIR

  - --init-from loads it (the one-layer shape check keeps only the first layer's dense layers) and
    trains, the table naming the experts, at 1 and 2 ranks with the same losses;
  - with output_router_logits true (the router's loss on), the fused loss trains, and a run that
    would leave the router's loss out is refused before anything is built, naming what to change:
    --fused-loss false, and --preference (its loss needs the logits).
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_folder  # noqa: E402

bins = sys.argv[1]
train = os.path.join(bins, "fsdp-train")
work = tempfile.mkdtemp(prefix="moe_cli_")
env = moe_folder.ENV
check = moe_folder.Checks()


def run(*args):
    p = subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def model_folder(name, router_logits):
    return moe_folder.model_folder(work, name, router_logits)


def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if l.strip()]


mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"]
if os.geteuid() == 0:
    mpirun.insert(1, "--allow-run-as-root")
common = ["--steps", "3", "--seq", "16", "--lr", "1e-2", "--threads", "1", "--sample-tokens", "0"]

plain = model_folder("plain", False)
for np_, launch, batch in ((1, [], "4"), (2, mpirun, "2")):
    log = os.path.join(work, f"plain{np_}.jsonl")
    rc, out = run(*launch, train, "--init-from", plain, *common, "--batch", batch, "--log-file", log)
    check(rc == 0, f"np {np_}: the Qwen3-MoE folder did not train: {out[-600:]}")
    if rc == 0 and np_ == 1:
        check("| experts" in out, f"the table has no experts row: {out[:1500]}")
if check.failed == 0:
    a, b = losses(os.path.join(work, "plain1.jsonl")), losses(os.path.join(work, "plain2.jsonl"))
    check(len(a) == 3 and all(abs(x - y) <= 1e-6 * abs(x) for x, y in zip(a, b)), f"np 2 {b} != np 1 {a}")

# Mixed precision (bf16 parameters and activations, f32 gradients): the experts' weight gradients
# are computed in bf16 and added into FSDP's f32 buffers; the losses follow f32's.
log = os.path.join(work, "bf16.jsonl")
rc, out = run(*mpirun, train, "--init-from", plain, *common, "--batch", "2", "--param-dtype", "bf16",
              "--reduce-dtype", "f32", "--log-file", log)
check(rc == 0, f"bf16 parameters with f32 gradients: {out[-600:]}")
if rc == 0 and check.failed == 0:
    a, b = losses(os.path.join(work, "plain1.jsonl")), losses(log)
    check(len(b) == 3 and all(abs(x - y) <= 2e-2 * abs(x) for x, y in zip(a, b)), f"bf16 {b} vs f32 {a}")

aux = model_folder("aux", True)
# The validation loss is the tokens' alone: before training it is the same with the router's
# loss on (the fused loss's last chunk) as without.
val = {}
for name, folder in (("plain", plain), ("aux", aux)):
    rc, out = run(train, "--init-from", folder, *common, "--batch", "4", "--eval-every", "3", "--eval-batches", "1",
                  "--eval-at-start")
    check(rc == 0, f"{name}: validation failed: {out[-600:]}")
    val[name] = [l for l in out.splitlines() if l.startswith("step 0 | val loss")]
check(val["plain"] and val["plain"] == val["aux"], f"the validation before training differs: {val}")
rc, out = run(train, "--init-from", aux, *common, "--batch", "4")
check(rc == 0, f"the router's loss with the fused loss did not train: {out[-600:]}")
rc, out = run(train, "--init-from", aux, *common, "--batch", "4", "--fused-loss", "false")
check(rc != 0 and "is added by the fused loss only, which --fused-loss false leaves out" in out,
      f"--fused-loss false with the router's loss: {rc} {out[-400:]}")
pairs = os.path.join(work, "pairs.jsonl")
with open(pairs, "w") as f:
    for i in range(4):
        f.write(json.dumps({"prompt": f"q{i}", "chosen": "yes", "rejected": "no"}) + "\n")
rc, out = run(train, "--init-from", aux, *common, "--batch", "4", "--tokenizer", "bytes", "--data", pairs,
              "--preference", "simpo")
check(rc != 0 and "which --preference (it needs the logits) leaves out" in out,
      f"--preference with the router's loss: {rc} {out[-400:]}")
check.finish()
