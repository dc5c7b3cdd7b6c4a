#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention, forward and backward, at the seed
preset's attention shape (B 8, H 16, T 1024, head 128, bf16), causal and not,
timed with CUDA events: the side of the attention comparison that
build/bench/fsdp-bench-kernels prints for ours. q, k and v are strided views
of one packed [B, T, 3, H, hd] buffer, as in fsdp-train. Prints one line per mask:
    torch-attention: causal=0 | fwd 0.114 ms | bwd 0.395 ms | torch 2.11
"""
import argparse

import torch
import torch.nn.functional as F


def time_ms(f, iters=20):
    for _ in range(3):
        f()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        f()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / iters


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--head-dim", type=int, default=128)
    a = p.parse_args()
    B, H, T, hd = a.batch, a.heads, a.seq, a.head_dim
    torch.manual_seed(0)
    qkv = torch.empty(B, T, 3, H, hd, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # [B, H, T, hd] views
    dout = torch.empty(B, H, T, hd, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
    # PyTorch picks its backend itself (cuDNN or flash on an H100/H200): we time its choice.
    for causal in (False, True):
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        fwd = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        bwd = time_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True))
        print(f"torch-attention: causal={int(causal)} | fwd {fwd:.3f} ms | bwd {bwd:.3f} ms | "
              f"torch {torch.__version__}", flush=True)


if __name__ == "__main__":
    main()
