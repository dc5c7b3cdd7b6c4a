#!/usr/bin/env python3
"""fsdp-train --expert-parallel N on a Qwen3-MoE folder written here (moe_folder.py: 4 experts,
top 2, the router's loss on, no torch).

    moe_ep_cli_test.py FSDP_BIN_DIR

  - 3 AdamW steps, the gradients clipped (so the norm counts every expert row once), at np 2
    (EP 2), np 4 (EP 2 x FSDP 2) and np 4 (EP 4): the losses and gradient norms equal np 1's to
    1e-6 relative in f32, and to 1e-12 in f64 (the ranks' sums are in another order than one
    rank's, so not bit for bit); the table shows the experts per rank;
  - refused, naming the flag: N not dividing the world size or the experts, N > 1 on a dense
    model, N < 1, and the options expert parallel does not cover yet (--hsdp, --ckpt-dir).
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
work = tempfile.mkdtemp(prefix="moe_ep_cli_")
env = moe_folder.ENV
check = moe_folder.Checks()


def run(np_, *args):
    launch = []
    if np_ > 1:
        launch = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
        if os.geteuid() == 0:
            launch.insert(1, "--allow-run-as-root")
    p = subprocess.run(launch + [train, *args], env=env, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def metrics(path):
    return [(r["loss"], r["grad_norm"]) for r in (json.loads(l) for l in open(path) if l.strip())]


def close(a, b, tol):
    return len(a) == len(b) == 3 and all(abs(x - y) <= tol * abs(x) for p, q in zip(a, b) for x, y in zip(p, q))


model = moe_folder.model_folder(work, "aux", True)
common = ["--init-from", model, "--steps", "3", "--seq", "16", "--lr", "1e-2", "--clip", "0.05",
          "--threads", "1", "--sample-tokens", "0"]
GLOBAL_BATCH = 4
for dtype, tol in (("f32", 1e-6), ("f64", 1e-12)):
    runs = {}
    for np_, ep in ((1, 1), (2, 2), (4, 2), (4, 4)):
        if dtype == "f64" and (np_, ep) == (4, 4):
            continue  # f64 covers one layout with FSDP beside EP
        log = os.path.join(work, f"{dtype}_np{np_}_ep{ep}.jsonl")
        rc, out = run(np_, *common, "--dtype", dtype, "--batch", str(GLOBAL_BATCH // np_),
                      "--expert-parallel", str(ep), "--log-file", log)
        check(rc == 0, f"{dtype} np {np_} EP {ep} did not train: {out[-800:]}")
        if rc != 0:
            continue
        runs[(np_, ep)] = metrics(log)
        if ep > 1:
            want = f"EP {ep} x FSDP {np_ // ep}: {4 // ep} experts per rank (of 4)"
            check(want in out, f"np {np_} EP {ep}: the table does not say '{want}': {out[:2500]}")
    base = runs.get((1, 1))
    for key, got in runs.items():
        if key != (1, 1) and base:
            check(close(base, got, tol), f"{dtype} np {key[0]} EP {key[1]}: {got} != np 1's {base}")

# Refusals, each naming the flag and the value.
dense = ["--preset", "tiny", "--steps", "1", "--threads", "1", "--sample-tokens", "0"]
for np_, args, want in (
        (2, [*common, "--batch", "2", "--expert-parallel", "4"],
         "--expert-parallel 4 does not divide the world size 2"),
        (3, [*common, "--batch", "1", "--expert-parallel", "3"],
         "--expert-parallel 3 does not divide the model's 4 experts"),
        (2, [*dense, "--expert-parallel", "2"], "--expert-parallel 2 splits a mixture of experts' experts, "
                                                "and the model is dense"),
        (1, [*common, "--expert-parallel", "0"], "--expert-parallel must be >= 1"),
        (2, [*common, "--batch", "2", "--expert-parallel", "2", "--hsdp", "2"],
         "--expert-parallel 2 is not supported with --hsdp"),
        (2, [*common, "--batch", "2", "--expert-parallel", "2", "--ckpt-dir", os.path.join(work, "ck")],
         "--expert-parallel 2 is not supported with --ckpt-dir")):
    rc, out = run(np_, *args)
    check(rc != 0 and want in out, f"np {np_} {args[-2:]}: not refused with '{want}': rc {rc} {out[-600:]}")
check.finish()
