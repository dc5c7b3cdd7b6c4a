#!/usr/bin/env python3
"""fsdp-train --expert-parallel N on a Qwen3-MoE folder written here (moe_folder.py: 4 experts,
top 2, the router's loss on, no torch).

    moe_ep_cli_test.py FSDP_BIN_DIR

  - 3 AdamW steps, the gradients clipped (so the norm counts every expert row once), at np 2
    (EP 2), np 4 (EP 2 x FSDP 2) and np 4 (EP 4): the losses and gradient norms equal np 1's to
    1e-6 relative in f32, and to 1e-12 in f64 (the ranks' sums are in another order than one
    rank's, so not bit for bit); the table shows the experts per rank; the step line and the log
    show the experts' load, np 1's in every layout; the memory plan's allocated peak is within 10%
    of the run's, and its persistent bytes equal the rank's;
  - a Mixtral folder (moe_folder.py: Mixtral's router, the top 2 of the logits then softmax over
    them; both blocks sparse) at np 2 (EP 2) gives np 1's losses, gradient norms and both layers'
    load, 1e-6 relative in f32;
  - at EP 2 x FSDP 2, activation checkpointing, --grad-accum 2, LoRA on the attention (the
    experts frozen), DPO (its reference model split alike) and Gloo (scripts/fsdprun) in place of MPI give np 1's losses too, and a TOML config's [sharding] expert_parallel sets it;
  - a checkpoint written at EP 2 x FSDP 2 (the experts' chunks at their global rows) resumes
    there bit for bit and loads at np 1 and np 3 (no EP) with the uninterrupted run's losses, and
    fsdp-export writes the weights of a run without EP;
  - refused, naming the flag: N not dividing the world size or the experts, N > 1 on a dense
    model, N < 1, and an option expert parallel does not cover yet (--hsdp).
"""
import array
import json
import os
import re
import shutil
import struct
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


def load(path):  # the MoE layer's experts' load per step: the most and the fewest (token, choice) pairs
    return [(r["load_max/layers.0.ffn"], r["load_min/layers.0.ffn"]) for r in
            (json.loads(l) for l in open(path) if l.strip())]


def read_safetensors(path):  # name -> f32 values
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for name, e in json.loads(raw[8:8 + n]).items():
        if name != "__metadata__":
            a, b = e["data_offsets"]
            out[name] = array.array("f", raw[8 + n + a:8 + n + b])
    return out


def close(a, b, tol):
    return len(a) == len(b) == 3 and all(abs(x - y) <= tol * abs(x) for p, q in zip(a, b) for x, y in zip(p, q))


model = moe_folder.model_folder(work, "aux", True)
common = ["--init-from", model, "--steps", "3", "--seq", "16", "--lr", "1e-2", "--clip", "0.05",
          "--threads", "1", "--sample-tokens", "0"]
GLOBAL_BATCH = 4
loads = {}
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
        loads[(dtype, np_, ep)] = load(log)
        check("| load_max/layers.0.ffn " in out, f"np {np_} EP {ep}: the step line has no experts' load")
        if ep > 1:
            want = f"EP {ep} x FSDP {np_ // ep}: {4 // ep} experts per rank (of 4)"
            check(want in out, f"np {np_} EP {ep}: the table does not say '{want}': {out[:2500]}")
            # the memory plan lays the experts out alike: its allocated peak within 10% of the run's
            ratio = re.search(r"MB allocated \(([0-9.]+)\)", out)
            check(ratio and 0.9 <= float(ratio.group(1)) <= 1.1,
                  f"np {np_} EP {ep}: measured/plan {ratio and ratio.group(1)}: {out[-600:]}")
            # and its persistent bytes (shards, grads, AdamW moments) are the rank's, exactly: the
            # experts a small share of this model, the 10% above would not see them planned wrong
            held = re.search(r"persistent mem / rank\s*\|\s*([0-9.]+) MB formula, ([0-9.]+) MB measured", out)
            check(held and held.group(1) == held.group(2),
                  f"np {np_} EP {ep}: persistent planned/held {held and held.groups()}")
    base = runs.get((1, 1))
    for key, got in runs.items():
        if key != (1, 1) and base:
            check(close(base, got, tol), f"{dtype} np {key[0]} EP {key[1]}: {got} != np 1's {base}")

# Mixtral: its own router and names, every block sparse, at EP 2 against np 1 (f32).
mixtral = moe_folder.model_folder(work, "mixtral", True, family="mixtral")
mix_common = [mixtral if a == model else a for a in common]
mix_runs, mix_loads = {}, {}
for np_, ep in ((1, 1), (2, 2)):
    log = os.path.join(work, f"mixtral_np{np_}_ep{ep}.jsonl")
    rc, out = run(np_, *mix_common, "--batch", str(GLOBAL_BATCH // np_),
                  "--expert-parallel", str(ep), "--log-file", log)
    check(rc == 0, f"mixtral np {np_} EP {ep} did not train: {out[-800:]}")
    if rc != 0:
        continue
    check("| hf mixtral / llama " in out and "4 per MoE block (2 of 2 blocks), top 2 of 16 wide:" in out,
          f"mixtral np {np_}: the table does not show a Mixtral of 2 sparse blocks: {out[:2500]}")
    if ep > 1:
        check("EP 2 x FSDP 1: 2 experts per rank (of 4)" in out, f"mixtral np {np_} EP {ep}: {out[:2500]}")
    mix_runs[np_] = metrics(log)
    mix_loads[np_] = [(r["load_max/layers.0.ffn"], r["load_min/layers.1.ffn"]) for r in
                      (json.loads(l) for l in open(log) if l.strip())]
check(close(mix_runs.get(1, []), mix_runs.get(2, []), 1e-6),
      f"mixtral np 2 EP 2: {mix_runs.get(2)} != np 1's {mix_runs.get(1)}")
check(mix_loads.get(1) and mix_loads.get(1) == mix_loads.get(2),
      f"mixtral np 2 EP 2: the experts' load {mix_loads.get(2)} != np 1's {mix_loads.get(1)}")

# Activation checkpointing (the MoE's forward again in its block's backward) and gradient
# accumulation (2 microbatches, the experts' gradients reduced on the last; in f64, as f32's
# rounding of the microbatches' sums alone moves plain FSDP's gradient norm by 1e-6) at EP 2 x FSDP 2.
extra = {}
for name, np_, batch, ep, args in (("ckpt", 4, 1, 2, ["--activation-checkpoint", "full"]),
                                   ("lora1", 1, 4, 1, ["--lora-rank", "4", "--lora-targets", "q,k,v,o"]),
                                   ("lora4", 4, 1, 2, ["--lora-rank", "4", "--lora-targets", "q,k,v,o"]),
                                   ("accum1", 1, 4, 1, ["--grad-accum", "2", "--dtype", "f64"]),
                                   ("accum4", 4, 1, 2, ["--grad-accum", "2", "--dtype", "f64"])):
    log = os.path.join(work, f"{name}.jsonl")
    rc, out = run(np_, *common, "--batch", str(batch), "--expert-parallel", str(ep), *args, "--log-file", log)
    check(rc == 0, f"{name}: np {np_} EP {ep} {args} did not train: {out[-800:]}")
    if rc == 0:
        extra[name] = metrics(log)
# DPO (the reference model split alike; the router's loss off: it needs the fused loss).
plain = moe_folder.model_folder(work, "plain", False)
pairs = os.path.join(work, "pairs.jsonl")
with open(pairs, "w") as f:
    for i in range(8):
        f.write(json.dumps({"prompt": f"question {i}?", "chosen": "yes indeed", "rejected": "no way"}) + "\n")
dpo = ["--init-from", plain, "--steps", "3", "--seq", "32", "--lr", "1e-2", "--threads", "1", "--sample-tokens", "0",
       "--tokenizer", "bytes", "--data", pairs, "--preference", "dpo"]
for name, np_, batch, ep in (("dpo1", 1, 8, 1), ("dpo4", 4, 2, 2)):
    log = os.path.join(work, f"{name}.jsonl")
    rc, out = run(np_, *dpo, "--batch", str(batch), "--expert-parallel", str(ep), "--log-file", log)
    check(rc == 0, f"DPO at np {np_} EP {ep} did not train: {out[-800:]}")
    if rc == 0:
        extra[name] = metrics(log)
check(close(extra.get("dpo1", []), extra.get("dpo4", []), 1e-6),
      f"DPO: EP 2 x FSDP 2 {extra.get('dpo4')} != np 1's {extra.get('dpo1')}")

# Gloo (scripts/fsdprun's torchrun-style launch) in place of MPI: its all-to-all and groups.
fsdprun = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "fsdprun")
log = os.path.join(work, "gloo.jsonl")
p = subprocess.run([fsdprun, "--standalone", "--nproc_per_node", "4", train, *common, "--batch", "1",
                    "--expert-parallel", "2", "--log-file", log], env=env, capture_output=True, text=True,
                   timeout=300)
check(p.returncode == 0 and "(gloo, torchrun)" in p.stdout + p.stderr,
      f"gloo EP 2 x FSDP 2 did not train: {(p.stdout + p.stderr)[-800:]}")
if p.returncode == 0:
    extra["gloo"] = metrics(log)
# A TOML run config sets it as the command line does.
toml = os.path.join(work, "ep.toml")
with open(toml, "w") as f:
    f.write("[sharding]\nexpert_parallel = 2\n")
rc, out = run(2, *common, "--batch", "2", "--config", toml)
check(rc == 0 and "EP 2 x FSDP 1: 2 experts per rank (of 4)" in out, f"--config's expert_parallel: {out[-800:]}")
f32_np1 = metrics(os.path.join(work, "f32_np1_ep1.jsonl"))
check(close(f32_np1, extra.get("gloo", []), 1e-6), f"gloo: {extra.get('gloo')} != {f32_np1}")
check(close(f32_np1, extra.get("ckpt", []), 1e-6), f"activation checkpointing: {extra.get('ckpt')} != {f32_np1}")
check(close(extra.get("lora1", []), extra.get("lora4", []), 1e-6),
      f"LoRA on the attention, the experts frozen: EP 2 x FSDP 2 {extra.get('lora4')} != np 1's {extra.get('lora1')}")
check(close(extra.get("accum1", []), extra.get("accum4", []), 1e-12),
      f"--grad-accum 2: EP 2 x FSDP 2 {extra.get('accum4')} != np 1's {extra.get('accum1')}")

# The load is the global batch's: every layout routes the same tokens alike (2 choices of 64 tokens).
first = loads.get(("f32", 1, 1))
check(first and all(hi >= lo >= 0 and hi <= 128 and hi * 4 >= 128 for hi, lo in first), f"the load: {first}")
for key, got in loads.items():
    want = loads.get((key[0], 1, 1))
    check(got == want, f"{key}: the experts' load {got} != np 1's {want}")

# Checkpoints: written at EP 2 x FSDP 2 after 2 of 4 steps (global batch 12, so np 3 splits it),
# resumed there bit for bit, and loaded at np 1 and np 3 without expert parallel: steps 2 and 3
# give the uninterrupted run's losses.
ckpt = os.path.join(work, "ckpt")
full_log, resumed = os.path.join(work, "full.jsonl"), {}
ck_common = [a for a in common if a not in ("--steps", "3")]
rc, out = run(4, *ck_common, "--steps", "4", "--batch", "3", "--expert-parallel", "2", "--log-file", full_log)
check(rc == 0, f"the uninterrupted EP 2 x FSDP 2 run failed: {out[-800:]}")
rc, out = run(4, *ck_common, "--steps", "2", "--batch", "3", "--expert-parallel", "2", "--ckpt-dir", ckpt,
              "--ckpt-every", "2")
check(rc == 0, f"the EP 2 x FSDP 2 run that saves failed: {out[-800:]}")
if check.failed == 0:
    meta = json.load(open(os.path.join(ckpt, "step_00000002", "metadata.json")))
    chunks = meta["tensors"]["layers.0.ffn.experts.gate_proj"]["chunks"]
    # rank r holds ep rank r % 2's experts [2 (r % 2), ...), of them FSDP shard r // 2's row
    check(chunks == [[0, 1], [2, 1], [1, 1], [3, 1]], f"the experts' chunks: {chunks}")
    for np_, batch, ep in ((4, 3, 2), (1, 12, 1), (3, 4, 1)):
        d = os.path.join(work, f"ckpt_np{np_}")
        shutil.copytree(ckpt, d)
        log = os.path.join(work, f"resumed_np{np_}.jsonl")
        rc, out = run(np_, *ck_common, "--steps", "4", "--batch", str(batch), "--expert-parallel", str(ep),
                      "--ckpt-dir", d, "--resume", "--log-file", log)
        check(rc == 0 and "resume: loaded" in out, f"np {np_}: the resume failed: {out[-800:]}")
        if rc == 0:
            resumed[np_] = [r["loss"] for r in (json.loads(l) for l in open(log) if l.strip())]
    # fsdp-export puts every expert at its row: the weights of a run without EP (np 2), to the
    # rounding that 2 AdamW steps make of the ranks' other sums (a misplaced row is off by ~0.1).
    plain_ckpt = os.path.join(work, "plain_ckpt")
    rc, out = run(2, *ck_common, "--steps", "2", "--batch", "6", "--ckpt-dir", plain_ckpt, "--ckpt-every", "2")
    check(rc == 0, f"np 2 without EP, saving: {out[-600:]}")
    exported = {}
    for name, d in (("ep", ckpt), ("plain", plain_ckpt)):
        path = os.path.join(work, f"export_{name}", "model.safetensors")
        os.makedirs(os.path.dirname(path))
        rc, out = subprocess.run([os.path.join(bins, "fsdp-export"), "--ckpt", d, "--out", path, "--names", "ours"],
                                 env=env, capture_output=True, text=True, timeout=300).returncode, ""
        check(rc == 0, f"fsdp-export of {d} failed")
        if rc == 0:
            exported[name] = read_safetensors(path)
    if len(exported) == 2:
        a, b = exported["ep"], exported["plain"]
        worst = max((abs(x - y) for k in a for x, y in zip(a[k], b.get(k, []))), default=1.0)
        check(sorted(a) == sorted(b) and worst <= 1e-4, f"the EP checkpoint's export differs by {worst}")
    want = [r["loss"] for r in (json.loads(l) for l in open(full_log) if l.strip())][2:]
    check(resumed.get(4) == want, f"EP 2 x FSDP 2 resumed {resumed.get(4)} != the uninterrupted {want}")
    for np_ in (1, 3):
        got = resumed.get(np_, [])
        check(len(got) == 2 and all(abs(x - y) <= 1e-6 * abs(y) for x, y in zip(got, want)),
              f"np {np_} from the EP checkpoint: {got} != {want}")

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
        (2, [*common, "--batch", "2", "--expert-parallel", "2", "--lora-rank", "4", "--base-quant", "keep"],
         "--expert-parallel 2 is not supported with --base-quant keep")):
    rc, out = run(np_, *args)
    check(rc != 0 and want in out, f"np {np_} {args[-2:]}: not refused with '{want}': rc {rc} {out[-600:]}")
check.finish()
