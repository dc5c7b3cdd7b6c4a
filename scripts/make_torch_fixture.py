#!/usr/bin/env python3
"""Writes tests/fixtures/seed_tiny_torch.safetensors: the reference MiniLLM
(the model of the reference train_fsdp.py, at a tiny size) built in PyTorch,
with its weights, three batches of tokens and targets, the loss and every
parameter gradient on the first batch, and the losses of three AdamW steps
(lr 1e-2, PyTorch's other defaults). Everything is float64, so the C++ test
can check itself in f64 tightly and in f32 within f32's rounding.

Run with a python that has torch (Debian's python3-torch is enough):
    /usr/bin/python3 -m scripts.make_torch_fixture
from the repository root: a module, so that it imports bench.minillm_torch as a package.
"""
import json
import os
import struct
import sys

import torch
import torch.nn as nn

from bench.minillm_torch import MiniLLM  # the reference script's model

CFG = dict(vocab=48, dim=16, layers=2, heads=4, seq=8, batch=2, steps=3, lr=1e-2)


def save_safetensors(path, tensors, metadata):
    dtypes = {torch.float64: "F64", torch.float32: "F32", torch.int64: "I64"}
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                              "seed_tiny_torch.safetensors")
    torch.manual_seed(0)
    c = CFG
    model = MiniLLM(c["vocab"], c["dim"], c["layers"], c["heads"]).double()
    with torch.no_grad():  # move biases and norm weights off their constant init so the test sees them act
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.1, 0.1)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    tokens = torch.randint(0, c["vocab"], (c["steps"], c["batch"], c["seq"]))
    targets = torch.randint(0, c["vocab"], (c["steps"], c["batch"], c["seq"]))

    tensors = {name: p.detach().clone() for name, p in model.state_dict().items()}
    tensors["input.tokens"] = tokens
    tensors["input.targets"] = targets

    logits = model(tokens[0])
    loss = nn.functional.cross_entropy(logits.view(-1, c["vocab"]), targets[0].view(-1))
    loss.backward()
    tensors["ref.loss"] = loss.detach().reshape(1)
    for name, p in model.named_parameters():
        tensors["grad." + name] = p.grad.detach().clone()

    opt = torch.optim.AdamW(model.parameters(), lr=c["lr"])
    losses = []
    for step in range(c["steps"]):
        opt.zero_grad()
        logits = model(tokens[step])
        loss = nn.functional.cross_entropy(logits.view(-1, c["vocab"]), targets[step].view(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    tensors["ref.adamw_losses"] = torch.tensor(losses, dtype=torch.float64)
    save_safetensors(out, tensors, {"config": json.dumps(c), "torch": torch.__version__})
    print(f"wrote {out}: loss {tensors['ref.loss'].item():.10f}, adamw losses {losses}")


if __name__ == "__main__":
    main()
