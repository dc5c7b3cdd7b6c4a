#!/usr/bin/env python3
"""The PyTorch FSDP2 reference for a mixture of experts (issue 51): transformers' own random
Qwen3MoeForCausalLM trained by PyTorch FSDP2 on CPU, the way fsdp-train trains the same folder.

  --make DIR [--vocab ... --experts ...]   builds Qwen3MoeForCausalLM(Qwen3MoeConfig(...)) with
                                           transformers' own initialization (seeded), f32, and
                                           saves it with save_pretrained (config.json and
                                           model.safetensors): what fsdp-train --init-from reads
  --tokens SHARD --vocab V [--count N]     N random token ids below V (seeded) as one llm.c shard
  --train DIR --data SHARD                 training under torchrun (gloo), one line per step:

    torchrun --standalone --nproc_per_node 2 bench/moe_fsdp2_ref.py --train DIR \\
        --data SHARD --steps 3 --batch 2 --seq 32

The training run is fsdp-train's (include/fsdp/train/flags.def, include/fsdp/nn/moe.h):
  - fully_shard on every decoder layer, then on the root; f32; --threads threads per rank (1);
  - the rows of bench/torch_finetune_ref.py's batch(): fsdp-train's unshuffled token windows, rank r
    taking rows [r --batch, (r + 1) --batch) of the step's world x --batch;
  - the loss: the mean token cross-entropy of the rank's rows, plus router_aux_loss_coef times the
    load-balancing loss of transformers' load_balancing_loss_func (output_router_logits=True: every
    MoE layer's router logits concatenated, aux = E sum_e C_e P_e / T^2 with C_e the (token,
    choice) pairs routed to e, P_e the sum of e's softmax probabilities, T the rows) -- but with
    the statistics of the global batch, as fsdp-train (and a one-rank run) has them: C and T are
    all-reduced (no gradient) and each rank's term is E world C . P_rank / T^2, so that the mean
    over the ranks is the global aux loss and FSDP2's averaged gradient is its gradient.
    Transformers' own out.aux_loss is each rank's batch alone; the script checks at every step that
    its formula, given one rank's statistics, is transformers' value (to 1e-6 relative), and prints
    what the loss would have been with each rank's own statistics ("per-rank aux").
  - AdamW (torch.optim.AdamW, foreach) with --lr, --beta1, --beta2, --eps, --weight-decay on every
    parameter (fsdp-train's defaults: 3e-4, 0.9, 0.999, 1e-8, 0.01), --grad-clip (0: none), a
    constant learning rate.
Prints per step:
    step 0 | loss 5.612345678 | per-rank aux 5.612345999 | 123 tok/s | grad norm 1.2345
and a summary:
    torch-ref: np 2 | tok/s 123.4 (steps 1..N-1) | step 1234.5 ms | peak rss 1.23 1.24 GB | threads 1 | torch 2.9.1
    torch-ref losses: [5.61, ...]
The reported loss is the mean over the ranks of their losses (fsdp-train's step line).
"""
import argparse
import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_finetune_ref import batch, read_shards, write_shard  # noqa: E402  fsdp-train's rows


def make_model(a):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(a.seed)
    cfg = Qwen3MoeConfig(
        vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.inter, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
        max_position_embeddings=max(256, a.max_seq), rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=False, num_experts=a.experts, num_experts_per_tok=a.top_k,
        moe_intermediate_size=a.moe_inter, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[int(x) for x in a.dense_layers.split(",") if x], output_router_logits=True,
        router_aux_loss_coef=a.aux_coef)
    model = Qwen3MoeForCausalLM(cfg)
    model.save_pretrained(a.make, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    active = n - expert + expert * a.top_k // a.experts
    print(f"torch-ref make: {a.make}: Qwen3MoeForCausalLM, {n} parameters ({n / 1e6:.2f} M), "
          f"{active / 1e6:.2f} M active per token, experts {a.experts} top {a.top_k}, "
          f"dense layers [{a.dense_layers}]")


def every_expert_forward(torch, block_cls):
    """Qwen3MoeSparseMoeBlock.forward of transformers 4.57, but over every expert, an expert with no
    rows included (an empty GEMM, a zero gradient). transformers runs only the experts that got
    rows; under FSDP2 an expert that one rank's rows missed then has no gradient there, and the
    ranks' reduce-scatters of that layer differ in size (gloo: "Received data size doesn't match
    expected size"); and AdamW would skip its weight decay and moments, where fsdp-train updates
    every expert. The numbers of the experts that do get rows are transformers' own."""
    import torch.nn.functional as F

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        if self.norm_topk_prob:
            routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final_hidden_states = torch.zeros((batch_size * sequence_length, hidden_dim), dtype=hidden_states.dtype,
                                          device=hidden_states.device)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        for expert_idx in range(self.num_experts):
            idx, top_x = torch.where(expert_mask[expert_idx])
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
            current_hidden_states = self.experts[expert_idx](current_state) * routing_weights[top_x, idx, None]
            final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
        return final_hidden_states.reshape(batch_size, sequence_length, hidden_dim), router_logits

    block_cls.forward = forward


def router_aux(torch, dist, router_logits, experts, top_k, world):
    """(this rank's share of the global load-balancing loss, the loss of this rank's statistics)."""
    logits = torch.cat(router_logits, dim=0)  # [layers x rows, E]
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    chosen = torch.topk(probs, top_k, dim=-1).indices
    pairs = torch.nn.functional.one_hot(chosen, experts).sum(dim=(0, 1)).to(torch.float32)  # C_e
    prob_sum = probs.sum(dim=0)  # P_e, with its gradient
    rows = float(logits.shape[0])
    local = experts * (pairs * prob_sum).sum() / (rows * rows)
    stats = torch.cat([pairs, torch.tensor([rows])]).detach()
    dist.all_reduce(stats)  # the global batch's C and T (no gradient: the choice is one-hot)
    pairs_all, rows_all = stats[:experts], stats[experts]
    share = experts * world * (pairs_all * prob_sum).sum() / (rows_all * rows_all)
    return share, local


def train(a):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen3_moe import modeling_qwen3_moe
    transformers.utils.logging.set_verbosity_error()
    every_expert_forward(torch, modeling_qwen3_moe.Qwen3MoeSparseMoeBlock)

    torch.set_num_threads(a.threads)
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    tokens = read_shards(a.data)
    model = AutoModelForCausalLM.from_pretrained(a.train, dtype=torch.float32, attn_implementation="sdpa")
    cfg = model.config
    if type(model).__name__ != "Qwen3MoeForCausalLM":
        sys.exit(f"moe_fsdp2_ref: {a.train}/config.json is a {type(model).__name__}, not a Qwen3MoeForCausalLM")
    model.train()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)  # embeddings, final norm, head
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            weight_decay=a.weight_decay, foreach=True)
    g_rows = world * a.batch
    step_tokens = g_rows * a.seq
    times, losses = [], []
    worst_aux = 0.0
    for step in range(a.steps):
        x, y = batch(tokens, step, g_rows, rank * a.batch, a.batch, a.seq)
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(input_ids=x, use_cache=False, output_router_logits=True)
        ce = F.cross_entropy(out.logits.reshape(-1, out.logits.size(-1)).float(), y.reshape(-1))
        share, local = router_aux(torch, dist, out.router_logits, cfg.num_experts, cfg.num_experts_per_tok, world)
        loss = ce + cfg.router_aux_loss_coef * share
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, a.grad_clip if a.grad_clip > 0 else float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        opt.step()
        # The mean loss over the ranks, and with each rank's own router statistics (transformers').
        both = torch.stack([loss.detach(), ce.detach() + cfg.router_aux_loss_coef * out.aux_loss.detach()])
        dist.all_reduce(both)  # gloo has no AVG
        dt = time.perf_counter() - t0
        worst_aux = max(worst_aux, abs(local.item() - out.aux_loss.item()) / abs(out.aux_loss.item()))
        mean_v, per_rank_v = (both / world).tolist()
        times.append(dt)
        losses.append(mean_v)
        if rank == 0:
            print(f"step {step} | loss {mean_v:.9f} | per-rank aux {per_rank_v:.9f} | "
                  f"{step_tokens / dt:.1f} tok/s | grad norm {float(norm):.6f}", flush=True)
    if worst_aux > 1e-6:
        sys.exit(f"moe_fsdp2_ref: rank {rank}: the load-balancing loss of its own statistics differs from "
                 f"transformers' out.aux_loss by {worst_aux:.2e} relative")
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6])  # KiB -> GB
    all_rss = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(all_rss, rss)
    steady = times[1:] if len(times) > 1 else times
    ms = 1000 * sum(steady) / len(steady)
    if rank == 0:
        print(f"torch-ref: aux formula = transformers' out.aux_loss on each rank's statistics (worst rel "
              f"{worst_aux:.1e})", flush=True)
        print(f"torch-ref: np {world} | tok/s {step_tokens / (ms / 1000):.1f} (steps {min(1, len(times) - 1)}.."
              f"{len(times) - 1}) | step {ms:.1f} ms | peak rss "
              f"{' '.join(f'{float(r):.2f}' for r in all_rss)} GB | threads {torch.get_num_threads()} | "
              f"torch {torch.__version__.split('+')[0]} | transformers {transformers.__version__}", flush=True)
        print("torch-ref losses: " + json.dumps(losses), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--make", metavar="DIR", help="build and save a random Qwen3-MoE")
    mode.add_argument("--tokens", metavar="SHARD", help="write random token ids as an llm.c shard")
    mode.add_argument("--train", metavar="DIR", help="train the folder under torchrun")
    g = p.add_argument_group("--make: the model (defaults: tests/moe_fsdp2_ref_test.py's)")
    g.add_argument("--vocab", type=int, default=256)
    g.add_argument("--dim", type=int, default=64)
    g.add_argument("--inter", type=int, default=96, help="the dense layers' intermediate size")
    g.add_argument("--layers", type=int, default=3)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--kv-heads", type=int, default=2)
    g.add_argument("--head-dim", type=int, default=16)
    g.add_argument("--experts", type=int, default=8)
    g.add_argument("--top-k", type=int, default=2)
    g.add_argument("--moe-inter", type=int, default=32)
    g.add_argument("--dense-layers", default="0", help="mlp_only_layers, comma-separated")
    g.add_argument("--aux-coef", type=float, default=0.02, help="router_aux_loss_coef")
    g.add_argument("--max-seq", type=int, default=256)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--count", type=int, default=8192, help="--tokens: how many")
    t = p.add_argument_group("--train")
    t.add_argument("--data", help="an llm.c token shard")
    t.add_argument("--steps", type=int, default=3)
    t.add_argument("--batch", type=int, default=2, help="rows per rank")
    t.add_argument("--seq", type=int, default=32)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--beta1", type=float, default=0.9)
    t.add_argument("--beta2", type=float, default=0.999)
    t.add_argument("--eps", type=float, default=1e-8)
    t.add_argument("--grad-clip", type=float, default=0.0)
    t.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    if a.make:
        return make_model(a)
    if a.tokens:
        rng = np.random.default_rng(a.seed)
        write_shard(a.tokens, rng.integers(0, a.vocab, size=a.count))
        print(f"torch-ref tokens: {a.count} random ids below {a.vocab} -> {a.tokens}")
        return
    if not a.data:
        p.error("--train needs --data")
    train(a)


if __name__ == "__main__":
    main()
