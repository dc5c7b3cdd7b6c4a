#!/usr/bin/env python3
"""fsdp-train --tensorboard against TensorBoard's own reader (the `tensorboard` package's
EventAccumulator, from PyPI; the test prints "skipped: ..." without it):

  a 2-rank run (mpirun) writes one event file, rank 0's, whose scalars (loss, lr, grad norm,
  tok/s, MFU, peak memory, step time, exposed communication, validation loss) have the JSONL
  log's steps and values (as float32), and whose config text is the run's config; a byte flipped
  in a record is caught by TensorBoard's CRC check (the record and those after it are dropped);
  the step line shows elapsed time and an ETA, and the run ends with its wall time.

usage: tensorboard_test.py BIN_DIR"""
import glob, json, os, shutil, struct, subprocess, sys, tempfile

try:
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print(f"skipped: the tensorboard package does not import here ({e}); "
          "scripts/install-deps.sh installs it")
    sys.exit(0)

BIN = sys.argv[1]
work = tempfile.mkdtemp(prefix="tensorboard_test_")
failures = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}")
    if not ok:
        failures.append(name)


def load(d):
    ea = EventAccumulator(d, size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


tb, log = os.path.join(work, "tb"), os.path.join(work, "log.jsonl")
cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
       "-x", "OMP_NUM_THREADS=1", os.path.join(BIN, "fsdp-train"), "--preset", "tiny",
       "--arch", "llama", "--vocab", "256", "--dim", "64", "--layers", "2", "--heads", "2",
       "--seq", "32", "--batch", "2", "--threads", "1", "--steps", "6", "--eval-every", "3",
       "--data", "/usr/share/common-licenses/GPL-3", "--sample-tokens", "0",
       "--tensorboard", tb, "--log-file", log]
r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
check("the run", r.returncode == 0, r.stdout[-500:] + r.stderr[-500:])
if r.returncode != 0:
    sys.exit(1)
files = glob.glob(os.path.join(tb, "events.out.tfevents.*"))
check("one event file (rank 0's)", len(files) == 1, str(files))

rows = [json.loads(l) for l in open(log) if l.strip()]
ea = load(tb)
tags = ea.Tags()["scalars"]
for tag, key, scale in [("loss", "loss", 1), ("lr", "lr", 1), ("grad_norm", "grad_norm", 1),
                        ("tok_s", "tok_s", 1), ("mfu", "mfu", 1), ("peak_mem_gb", "peak_mem_gb", 1),
                        ("step_ms", "step_ms", 1), ("val_loss", "val_loss", 1)]:
    want = [(row["step"], float(np.float32(row[key] * scale))) for row in rows if key in row]
    got = [(e.step, e.value) for e in ea.Scalars(tag)] if tag in tags else []
    check(f"scalar {tag}: TensorBoard's steps and values are the log's ({len(want)} points)",
          got == want and len(want) > 0, f"TensorBoard {got}, log {want}")
check("scalar comm_exposed_ms at 2 ranks", "comm_exposed_ms" in tags
      and [e.step for e in ea.Scalars("comm_exposed_ms")] == [row["step"] for row in rows], str(tags))
config = ea.Tensors("config")[0].tensor_proto.string_val[0].decode() if "config" in ea.Tags()["tensors"] else ""
body = config.strip().strip("`").strip()
try:
    cfg = json.loads(body)
except ValueError:
    cfg = {}
check("the config text is the run's config", cfg.get("dim") == 64 and cfg.get("world_size") == 2,
      config[:200])

# A byte flipped inside a late record: TensorBoard's CRC check drops it and what follows.
bad = os.path.join(work, "bad")
os.makedirs(bad)
shutil.copy(files[0], bad)
f = glob.glob(os.path.join(bad, "*"))[0]
b = bytearray(open(f, "rb").read())
b[len(b) - 6] ^= 0x10  # inside the last record's float (its length field stays sound)
open(f, "wb").write(bytes(b))
n_good = sum(len(ea.Scalars(t)) for t in tags)
eb = load(bad)
n_bad = sum(len(eb.Scalars(t)) for t in eb.Tags()["scalars"])
check("a flipped byte is caught by TensorBoard's CRC check", n_bad < n_good, f"{n_bad} of {n_good} scalars read")

# A resumed run writes a new event file that starts a session at its first step: TensorBoard
# drops the earlier session's events from that step on, so no step shows twice.
one = ["mpirun", "--allow-run-as-root", "-np", "1", "-x", "OMP_NUM_THREADS=1"] + cmd[cmd.index("-x") + 2:]
one = [a for a in one]
rtb, ck = os.path.join(work, "rtb"), os.path.join(work, "ck")
base = [a if a != tb else rtb for a in one if a not in ("--log-file", log)]
base = base[:base.index("--steps")] + base[base.index("--steps") + 2:]
r1 = subprocess.run(base + ["--steps", "4", "--ckpt-dir", ck, "--ckpt-every", "2"], capture_output=True, text=True, timeout=300)
shutil.rmtree(os.path.join(ck, "step_00000004"), ignore_errors=True)  # as if it had died after step 3
r2 = subprocess.run(base + ["--steps", "4", "--ckpt-dir", ck, "--ckpt-every", "2", "--resume"], capture_output=True, text=True, timeout=300)
ok = r1.returncode == 0 and r2.returncode == 0
er = load(rtb) if ok else None
steps = [e.step for e in er.Scalars("loss")] if ok else []
check("a resume's session replaces the steps it repeats", ok and steps == [0, 1, 2, 3]
      and len(glob.glob(os.path.join(rtb, "events.out.tfevents.*"))) == 2,
      f"steps {steps}; {r1.stderr[-300:]} {r2.stderr[-300:]}")

# The step line's elapsed time and ETA; the run's summary line.
lines = [l for l in r.stdout.splitlines() if l.startswith("step ") and "| loss " in l]
check("the step line shows elapsed and eta", len(lines) == 6 and all(" | elapsed " in l and " | eta " in l for l in lines),
      "\n".join(lines[:2]))
check("the run ends with its wall time, tokens and best val loss",
      any(l.startswith("run | wall ") and " tokens | " in l and "best val loss" in l for l in r.stdout.splitlines()),
      r.stdout[-400:])

shutil.rmtree(work, ignore_errors=True)
print("tensorboard_test: " + ("all passed" if not failures else f"FAILED: {failures}"))
sys.exit(1 if failures else 0)
