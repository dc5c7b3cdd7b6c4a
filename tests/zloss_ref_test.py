"""examples/custom_trainer/zloss.cpp (a loss of the trainer's own, cross-entropy plus PaLM's z-loss
1e-4 * logsumexp^2 averaged over the targets, passed to the library's train_step) against a
float64 reference written here in numpy: the same bigram model (embedding, then head), the same
initial weights (the library's counter-based initialisation: seed, parameter name, element index,
rounded to f32 as the shards are) and tokens (RandomTokenSource's counters), the gradients by hand
(softmax - one-hot, plus 2e-4 lse softmax), global-norm clipping at 1 and torch.optim.AdamW's step.
Each step's loss at np 1 and np 2 must equal the reference's to 1e-6 relative (f32 against f64;
measured 3e-9; without the z-term's gradient the reference moves 4e-6 by step 7),
and the memory plan the example prints must plan that loss: its "loss" term names the z-loss and
holds at least its [rows, vocab] f32 gradient buffer.

usage: zloss_ref_test.py BIN"""
import re
import subprocess
import sys

import numpy as np

VOCAB, DIM, SEQ, BATCH, STEPS = 64, 16, 16, 8, 8
SEED, LR, CLIP, Z = 1, 1e-2, 1.0, 1e-4
M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def name_hash(name):  # FNV-1a
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


def uniform(key, counter):  # (0, 1)
    r = splitmix64(key ^ splitmix64(counter))
    return ((r >> 11) + 0.5) * (1.0 / 9007199254740992.0)


def init(name, shape, kind, a, b):
    key = splitmix64(SEED) ^ name_hash(name)
    n = shape[0] * shape[1]
    if kind == "uniform":
        v = [a + (b - a) * uniform(key, i) for i in range(n)]
    else:
        v = [a + b * np.sqrt(-2.0 * np.log(uniform(key, 2 * i))) * np.cos(2.0 * np.pi * uniform(key, 2 * i + 1))
             for i in range(n)]
    return np.array(v, dtype=np.float64).astype(np.float32).astype(np.float64).reshape(shape)


def batch(k):  # the global batch k: rows k * BATCH .. of RandomTokenSource(VOCAB, seed 1)
    key = name_hash("random-tokens") ^ ((SEED * 0x9E3779B97F4A7C15) & M64)
    inp = np.zeros((BATCH, SEQ), dtype=np.int64)
    tgt = np.zeros((BATCH, SEQ), dtype=np.int64)
    for r in range(BATCH):
        for t in range(SEQ):
            idx = ((k * BATCH + r) * SEQ + t) * 2
            inp[r, t] = int(uniform(key, idx) * VOCAB)
            tgt[r, t] = int(uniform(key, idx + 1) * VOCAB)
    return inp.reshape(-1), tgt.reshape(-1)


def reference():
    emb = init("0.weight", (VOCAB, DIM), "normal", 0.0, 1.0)
    bound = 1.0 / np.sqrt(DIM)
    head = init("1.weight", (VOCAB, DIM), "uniform", -bound, bound)
    params = [emb, head]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    losses = []
    for step in range(STEPS):
        inp, tgt = batch(step)
        n = len(inp)
        x = emb[inp]                       # [N, D]
        logits = x @ head.T                # [N, V]
        mx = logits.max(axis=1, keepdims=True)
        lse = (mx + np.log(np.exp(logits - mx).sum(axis=1, keepdims=True)))[:, 0]
        ce = np.mean(lse - logits[np.arange(n), tgt])
        zl = Z * np.mean(lse ** 2)
        losses.append(ce + zl)
        p = np.exp(logits - lse[:, None])
        onehot = np.zeros_like(p)
        onehot[np.arange(n), tgt] = 1.0
        dlogits = (p - onehot) / n + 2.0 * Z * lse[:, None] * p / n
        dhead = dlogits.T @ x
        demb = np.zeros_like(emb)
        np.add.at(demb, inp, dlogits @ head)
        grads = [demb, dhead]
        norm = np.sqrt(sum((g ** 2).sum() for g in grads))
        coef = CLIP / (norm + 1e-6)
        if coef < 1.0:
            grads = [g * coef for g in grads]
        t = step + 1
        for i, (pa, g) in enumerate(zip(params, grads)):  # torch.optim.AdamW, weight decay 0
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            pa -= LR * (m[i] / (1 - 0.9 ** t)) / (np.sqrt(v[i] / (1 - 0.999 ** t)) + 1e-8)
    return losses


def main():
    binary = sys.argv[1]
    ref = reference()
    failed = 0
    for np_ in (1, 2):
        out = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                              "-np", str(np_), binary, str(STEPS)],
                             capture_output=True, text=True, timeout=300,
                             env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
        if out.returncode != 0:
            print(f"zloss_ref_test: FAIL: np {np_}: exit {out.returncode}: {out.stderr[-600:]}")
            return 1
        got = [float(x) for x in re.findall(r"^step \d+ \| loss (\S+)$", out.stdout, re.M)]
        if len(got) != STEPS:
            print(f"zloss_ref_test: FAIL: np {np_}: {len(got)} step lines, expected {STEPS}")
            return 1
        for s, (g, r) in enumerate(zip(got, ref)):
            rel = abs(g - r) / abs(r)
            if rel > 1e-6:
                print(f"zloss_ref_test: FAIL: np {np_} step {s}: loss {g!r}, the f64 reference {r!r} "
                      f"(relative {rel:.2e} > 1e-6)")
                failed += 1
        print(f"np {np_}: losses {got[0]:.9f} .. {got[-1]:.9f}; reference {ref[0]:.9f} .. {ref[-1]:.9f}; "
              f"largest relative difference {max(abs(g - r) / abs(r) for g, r in zip(got, ref)):.2e}")
        # The plan names the z-loss and holds its d(z)/d(logits) buffer: this rank's rows x vocab, f32.
        plan = re.search(r"^plan \| loss (.*): (\d+) bytes of its own$", out.stdout, re.M)
        term = re.search(r"^plan \| loss: (\d+) bytes", out.stdout, re.M)
        rows = BATCH // np_ * SEQ
        if not plan or "z-loss" not in plan.group(1) or int(plan.group(2)) < rows * VOCAB * 4 or not term:
            print(f"zloss_ref_test: FAIL: np {np_}: the plan does not plan the z-loss's "
                  f"{rows * VOCAB * 4} bytes: {[l for l in out.stdout.splitlines() if l.startswith('plan')]}")
            failed += 1
        else:
            print(f"np {np_}: plan: {plan.group(0)}; at the peak: {term.group(0)}")
    if failed:
        return 1
    print("zloss_ref_test: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
