#!/usr/bin/env python3
"""The reference MiniLLM (the model of the reference train_fsdp.py) trained on one
CPU process in PyTorch, for a side-by-side timing with fsdp-train. Same
model, same AdamW, random tokens; prints one line per step and a summary:
    torch: ms/step 123.4 (steps 2..N), tok/s 12345
"""
import argparse
import time

import torch
import torch.nn as nn


class RMSNorm(nn.Module):  # nn.RMSNorm(dim) for torch builds older than 2.4
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps) * self.weight


Norm = getattr(nn, "RMSNorm", RMSNorm)


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.norm1 = Norm(dim)
        self.attn = nn.MultiheadAttention(dim, n_heads, batch_first=True)
        self.norm2 = Norm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, dim * 4, bias=False), nn.SiLU(), nn.Linear(dim * 4, dim, bias=False))

    def forward(self, x):
        h = self.norm1(x)
        attn_out, _ = self.attn(h, h, h, need_weights=False)
        x = x + attn_out
        return x + self.ffn(self.norm2(x))


class MiniLLM(nn.Module):
    def __init__(self, vocab, dim, layers, heads):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([TransformerBlock(dim, heads) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def llama_ffn_hidden(dim):
    """fsdp-train's default for --arch llama: 2/3 of 4*dim, rounded up to a multiple of 256."""
    h = 2 * (4 * dim) // 3
    return (h + 255) // 256 * 256


def rotate_half_split(x, theta):
    """Rotary embedding pairing dims i and i + hd/2 (Hugging Face's and fsdp-train's), on
    x [B, H, T, hd]."""
    hd, t = x.shape[-1], x.shape[-2]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(t, device=x.device, dtype=torch.float32), inv)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class LlamaBlock(nn.Module):
    """fsdp-train's --arch llama block: pre-norm, one fused q/k/v projection without biases,
    rotary positions, causal SDPA, SwiGLU FFN."""

    def __init__(self, dim, n_heads, hidden, theta=10000.0):
        super().__init__()
        self.heads, self.theta = n_heads, theta
        self.norm1 = Norm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.norm2 = Norm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        q, k = rotate_half_split(q, self.theta), rotate_half_split(k, self.theta)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.w2(nn.functional.silu(self.w1(h)) * self.w3(h))


class LlamaLLM(nn.Module):
    def __init__(self, vocab, dim, layers, heads, hidden=0):
        super().__init__()
        hidden = hidden or llama_ffn_hidden(dim)
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([LlamaBlock(dim, heads, hidden) for _ in range(layers)])
        self.norm = Norm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = MiniLLM(a.vocab, a.dim, a.layers, a.heads)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    times = []
    for step in range(a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq))
        targets = torch.randint(0, a.vocab, (a.batch, a.seq))
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.view(-1, a.vocab), targets.view(-1))
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        times.append(dt)
        print(f"step {step} | loss {loss.item():.4f} | {a.batch * a.seq / dt:.0f} tok/s", flush=True)
    steady = times[2:] if len(times) > 2 else times
    ms = 1000 * sum(steady) / len(steady)
    print(f"torch: ms/step {ms:.1f} (steps 2..{a.steps - 1}), tok/s {a.batch * a.seq / (ms / 1000):.0f}, "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
