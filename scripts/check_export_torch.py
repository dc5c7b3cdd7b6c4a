#!/usr/bin/env python3
"""Loads an fsdp-export safetensors file of the seed architecture into the
reference PyTorch MiniLLM (the model of the reference train_fsdp.py) with
load_state_dict(strict=True) and runs a forward pass.
    /usr/bin/python3 -m scripts.check_export_torch model.safetensors
from the repository root: a module, so that it imports bench.minillm_torch as a package.
"""
import json
import struct
import sys

import torch

from bench.minillm_torch import MiniLLM  # the reference model, RMSNorm for old torch included


def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    types = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    out = {}
    for k, v in h.items():
        s, e = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(b[8 + n + s:8 + n + e]), dtype=types[v["dtype"]]).reshape(v["shape"])
    return out, json.loads(meta["fsdp.config"])


def main():
    sd, c = load(sys.argv[1])
    model = MiniLLM(c["vocab"], c["dim"], c["layers"], c["heads"])
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    logits = model(torch.randint(0, c["vocab"], (1, 8)))
    assert torch.isfinite(logits).all()
    print(f"check_export_torch: loaded {len(sd)} tensors strictly; logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
