#!/usr/bin/env python3
"""The reference PyTorch FSDP2 run for the side-by-side GPU benchmark: the
model, sharding and optimizer of the reference train_fsdp.py (fully_shard on
each block and the root, MixedPrecisionPolicy(bf16, fp32), AdamW lr 3e-4),
with its configuration as flags and timing added. Run it as the reference
script is run, as a module from the repository root (it imports bench.minillm_torch):
    torchrun --nproc_per_node 1 -m bench.torch_fsdp_ref --steps 20 [--arch llama]
Prints one line per step and a summary:
    torch-ref: arch seed | tok/s 123456 (steps 2..N) | peak 12.34 GB | step 123.4 ms
--arch llama is fsdp-train's llama at the same size: causal SDPA, rotary
positions, SwiGLU, final norm, no biases.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

try:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # older torch
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

from bench.minillm_torch import LlamaLLM, MiniLLM  # the reference script's model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--arch", choices=["seed", "llama"], default="seed",
                   help="seed: the reference script's model; llama: fsdp-train's --arch llama")
    a = p.parse_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    arch = MiniLLM if a.arch == "seed" else LlamaLLM
    model = arch(a.vocab, a.dim, a.layers, a.heads).to(device)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    times = []
    for step in range(a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq), device=device)
        targets = torch.randint(0, a.vocab, (a.batch, a.seq), device=device)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.view(-1, a.vocab), targets.view(-1))
        loss.backward()
        opt.step()
        loss_v = loss.item()  # as the reference prints it each step
        dt = time.perf_counter() - t0
        times.append(dt)
        if local_rank == 0:
            mem = torch.cuda.max_memory_allocated(device) / 1e9
            print(f"Step {step} | Loss: {loss_v:.4f} | Peak VRAM/GPU: {mem:.2f} GB | {a.batch * a.seq / dt:.0f} tok/s",
                  flush=True)
    steady = times[2:] if len(times) > 2 else times
    ms = 1000 * sum(steady) / len(steady)
    if local_rank == 0:
        print(f"torch-ref: arch {a.arch} | tok/s {a.batch * a.seq / (ms / 1000):.0f} (steps 2..{a.steps - 1}) | "
              f"peak {torch.cuda.max_memory_allocated(device) / 1e9:.2f} GB | step {ms:.1f} ms | torch {torch.__version__}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
