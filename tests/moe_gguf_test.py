#!/usr/bin/env python3
"""The GGUF export of the mixture-of-experts families, against llama.cpp:

    moe_gguf_test.py FSDP_BIN_DIR

A Qwen3-MoE (8 experts, top 2, norm_topk_prob, GQA, QK-norm) and a Mixtral (4 experts, top 2, GQA)
are written here as Hugging Face folders (random f32 weights, no torch), trained 2 steps by
fsdp-train and exported by fsdp-export to a Hugging Face folder and a GGUF:
  - read with llama.cpp's own reader (the gguf package; runs in CI): general.architecture qwen3moe
    and llama, expert_count, expert_used_count, expert_feed_forward_length (qwen3moe) and
    feed_forward_length (the experts' width for Mixtral), exactly the tensor names llama.cpp's
    loader asks for, ffn_{gate,up,down}_exps as 3-D tensors (ne [dim, H, E], [H, dim, E]) and
    ffn_gate_inp ne [dim, E], each expert's matrix bit-equal to the Hugging Face export's;
  - fsdp-generate --model on the GGUF (the MoE read back from its keys, each expert's rows of the 3-D
    tensors) gives the checkpoint's logits, and on an f16 GGUF those of the export rounded to f16;
  - what llama.cpp's qwen3moe cannot represent is refused by name: norm_topk_prob false, a dense
    block (mlp_only_layers);
  - where llama-cpp-python imports under FSDP_TORCH_PYTHON (bench/setup_torch_ref.sh with
    WITH_LLAMA_CPP=1; else said and skipped): llama.cpp's logits on the exported GGUF equal
    fsdp-generate's on the checkpoint within 1e-3, and its 20 greedy tokens are fsdp-generate's;
    quantized by llama.cpp to Q8_0 (the experts too), fsdp-generate reads it nearer to llama.cpp on
    that file than the unquantized model is; LoRA of the attention trained from the GGUF, its
    adapter exported with --gguf-lora, gives in llama.cpp fsdp-generate's logits; quantized by llama.cpp to Q4_K_M (a 256-wide
    Qwen3-MoE), LoRA on the attention trains with --base-quant keep (the experts kept as their
    Q4_K/Q6_K blocks) at 1 and 2 ranks with the dequantized-first run's losses, bit for bit, and
    --lora-targets naming an expert projection is refused by name.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

try:
    from gguf import GGUFReader
except ImportError:
    sys.exit("moe_gguf_test: the gguf package is missing; run scripts/install-deps.sh")

bins = sys.argv[1]
work = tempfile.mkdtemp(prefix="moe_gguf_")
env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}", flush=True)


def run(*args, ok=True, stdout=False):
    """(exit status, stdout + stderr), or stdout alone with stdout=True; a failure with ok exits."""
    p = subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, timeout=300)
    if ok and p.returncode != 0:
        print(f"FAIL: {' '.join(map(str, args))} exited {p.returncode}:\n{(p.stdout + p.stderr)[-1500:]}")
        sys.exit(1)
    return p.returncode, p.stdout if stdout else p.stdout + p.stderr


D, HEADS, KV, HD, V, L = 64, 4, 2, 16, 300, 2


def save_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for key, a in tensors.items():
        raw = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[key] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def model_folder(name, family, experts, moe_ff, extra=None, D=D, HEADS=HEADS, HD=HD):
    """A Hugging Face folder of `family` (qwen3_moe or mixtral), every block sparse."""
    rng = np.random.default_rng(7)
    w = lambda *shape, scale=0.1: rng.normal(0, scale, shape).astype(np.float32)
    ones = lambda n: (1 + rng.normal(0, 0.05, n)).astype(np.float32)
    t = {"model.embed_tokens.weight": w(V, D, scale=0.5), "lm_head.weight": w(V, D, scale=0.5),
         "model.norm.weight": ones(D)}
    moe = "mlp" if family == "qwen3_moe" else "block_sparse_moe"
    proj = ("gate_proj", "up_proj", "down_proj") if family == "qwen3_moe" else ("w1", "w3", "w2")
    for layer in range(L):
        p = f"model.layers.{layer}."
        t.update({p + "input_layernorm.weight": ones(D), p + "post_attention_layernorm.weight": ones(D),
                  p + "self_attn.q_proj.weight": w(HEADS * HD, D), p + "self_attn.k_proj.weight": w(KV * HD, D),
                  p + "self_attn.v_proj.weight": w(KV * HD, D), p + "self_attn.o_proj.weight": w(D, HEADS * HD),
                  f"{p}{moe}.gate.weight": w(experts, D, scale=0.5)})
        if family == "qwen3_moe":
            t.update({p + "self_attn.q_norm.weight": ones(HD), p + "self_attn.k_norm.weight": ones(HD)})
        for e in range(experts):
            q = f"{p}{moe}.experts.{e}."
            t.update({q + proj[0] + ".weight": w(moe_ff, D), q + proj[1] + ".weight": w(moe_ff, D),
                      q + proj[2] + ".weight": w(D, moe_ff)})
    folder = os.path.join(work, name)
    os.makedirs(folder)
    save_safetensors(os.path.join(folder, "model.safetensors"), t)
    config = {"vocab_size": V, "hidden_size": D, "num_hidden_layers": L, "num_attention_heads": HEADS,
              "num_key_value_heads": KV, "head_dim": HD, "num_experts_per_tok": 2, "max_position_embeddings": 128,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "attention_bias": False, "torch_dtype": "float32"}
    if family == "qwen3_moe":
        config.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "intermediate_size": 96,
                       "moe_intermediate_size": moe_ff, "num_experts": experts, "norm_topk_prob": True,
                       "decoder_sparse_step": 1, "mlp_only_layers": []})
    else:
        config.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                       "intermediate_size": moe_ff, "num_local_experts": experts, "sliding_window": None})
    config.update(extra or {})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


train, export, generate = (os.path.join(bins, f"fsdp-{x}") for x in ("train", "export", "generate"))
common = ["--steps", "2", "--seq", "32", "--batch", "2", "--lr", "1e-2", "--threads", "2", "--sample-tokens", "0",
          "--ckpt-every", "2"]


def fine_tune(name, folder):
    ck = os.path.join(work, name + "_ck")
    run(train, "--init-from", folder, *common, "--ckpt-dir", ck)
    hf, gg = os.path.join(work, name + "_hf"), os.path.join(work, name + ".gguf")
    os.makedirs(hf)
    run(export, "--ckpt", ck, "--out", os.path.join(hf, "model.safetensors"), "--gguf", gg)
    return ck, hf, gg


def load_safetensors(path):
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(v["shape"])
    return out


def check_gguf(family, gg, hf, arch, experts, moe_ff):
    r = GGUFReader(gg)
    field = lambda k: r.fields[k].contents() if k in r.fields else None
    check(field("general.architecture") == arch, f"{family}: architecture {field('general.architecture')}")
    check(field(f"{arch}.expert_count") == experts and field(f"{arch}.expert_used_count") == 2,
          f"{family}: expert_count {field(f'{arch}.expert_count')}, used {field(f'{arch}.expert_used_count')}")
    if arch == "qwen3moe":
        check(field("qwen3moe.expert_feed_forward_length") == moe_ff,
              f"qwen3moe.expert_feed_forward_length {field('qwen3moe.expert_feed_forward_length')}")
    else:
        check(field("llama.feed_forward_length") == moe_ff,
              f"mixtral: llama.feed_forward_length {field('llama.feed_forward_length')} is not the experts' {moe_ff}")
    tensors = {t.name: t for t in r.tensors}
    # The names llama.cpp's loader asks for (models/qwen3moe.cpp, models/llama.cpp with n_expert > 0).
    per_block = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate_inp",
                 "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
    if arch == "qwen3moe":
        per_block += ["attn_q_norm", "attn_k_norm"]
    want = {"token_embd.weight", "output_norm.weight", "output.weight"}
    want |= {f"blk.{i}.{n}.weight" for i in range(L) for n in per_block}
    check(set(tensors) == want, f"{family}: tensors {sorted(set(tensors) ^ want)} differ from llama.cpp's")
    ne = lambda n: [int(x) for x in tensors[n].shape] if n in tensors else None
    check(ne("blk.0.ffn_gate_inp.weight") == [D, experts], f"{family}: ffn_gate_inp ne {ne('blk.0.ffn_gate_inp.weight')}")
    for n, shape in (("gate", [D, moe_ff, experts]), ("up", [D, moe_ff, experts]), ("down", [moe_ff, D, experts])):
        check(ne(f"blk.1.ffn_{n}_exps.weight") == shape, f"{family}: ffn_{n}_exps ne {ne(f'blk.1.ffn_{n}_exps.weight')}")
    # Each expert's matrix is the Hugging Face export's, bit for bit (f32), and so is the router.
    h = load_safetensors(os.path.join(hf, "model.safetensors"))
    moe = "mlp" if family == "qwen3_moe" else "block_sparse_moe"
    proj = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"} if family == "qwen3_moe" else \
           {"gate": "w1", "up": "w3", "down": "w2"}
    same = True
    for i in range(L):
        same &= np.array_equal(np.asarray(tensors[f"blk.{i}.ffn_gate_inp.weight"].data), h[f"model.layers.{i}.{moe}.gate.weight"])
        for n, p in proj.items():
            stack = np.asarray(tensors[f"blk.{i}.ffn_{n}_exps.weight"].data)
            same &= stack.shape[0] == experts and all(
                np.array_equal(stack[e], h[f"model.layers.{i}.{moe}.experts.{e}.{p}.weight"]) for e in range(experts))
    check(same, f"{family}: the GGUF's experts or router differ from the Hugging Face export's")


LLAMA_CPP = r"""
import json, sys
import numpy as np
try:
    import llama_cpp
except ImportError as e:
    print(json.dumps({"skip": str(e)}))
    sys.exit(0)
path, ids, quantized = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], sys.argv[3]
lora = sys.argv[4] if len(sys.argv) > 4 else None  # a GGUF LoRA adapter (llama.cpp's --lora)
if quantized:  # llama.cpp's llama-quantize, Q8_0
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    if llama_cpp.llama_model_quantize(path.encode(), quantized.encode(), params) != 0:
        sys.exit("llama_model_quantize failed")
    path = quantized
m = llama_cpp.Llama(model_path=path, lora_path=lora, n_ctx=128, n_threads=2, logits_all=True, type_k=0, type_v=0, verbose=False)
m.eval(ids)
scores = np.array(m.scores[:len(ids)]).tolist()
got = []
for t in m.generate(ids, temp=0.0, top_k=1, reset=True):
    got.append(int(t))
    if len(got) == 20:
        break
print(json.dumps({"scores": scores, "tokens": got}))
"""


PROMPT = [int(x) for x in np.random.default_rng(3).integers(0, 256, 12)]
IDS = ",".join(map(str, PROMPT))


def logits(*model):
    _, out = run(generate, *model, "--prompt-ids", IDS, "--print-logits", "--threads", "2", stdout=True)
    return np.array(json.loads(out.strip().splitlines()[-1])["logits"])


def read_back(family, ck, gg, hf):
    """fsdp-generate --model on the GGUF (the MoE read back: keys, each rank's experts' rows) gives the
    checkpoint's logits."""
    d = np.abs(logits("--model", gg) - logits("--ckpt", ck)).max()
    print(f"{family}: fsdp-generate on the GGUF vs on the checkpoint: max |logit diff| {d:.2e}")
    check(d < 1e-5, f"{family}: the GGUF read back gives logits {d} from the checkpoint's")
    # F16: the GGUF read back is the f32 Hugging Face export with its matrices rounded to f16 (the
    # GGUF keeps 1-D tensors F32), computed in f32.
    gg16, hf16 = os.path.join(work, family + ".f16.gguf"), os.path.join(work, family + "_hf16")
    run(export, "--ckpt", ck, "--dtype", "f16", "--gguf", gg16)
    types = {t.tensor_type.name for t in GGUFReader(gg16).tensors if "_exps" in t.name}
    os.makedirs(hf16)
    shutil.copy(os.path.join(hf, "config.json"), hf16)
    save_safetensors(os.path.join(hf16, "model.safetensors"),
                     {k: v.astype(np.float16).astype(np.float32) if v.ndim > 1 else v
                      for k, v in load_safetensors(os.path.join(hf, "model.safetensors")).items()})
    d = np.abs(logits("--model", gg16) - logits("--model", hf16)).max()
    print(f"{family}: fsdp-generate on the f16 GGUF (experts {sorted(types)}) vs on the f32 export rounded to "
          f"f16: max |logit diff| {d:.2e}")
    check(types == {"F16"} and d < 1e-5, f"{family}: the f16 GGUF ({types}) gives logits {d} from the rounded export's")


def against_llama_cpp(family, ck, gg):
    python = os.environ.get("FSDP_TORCH_PYTHON")
    if not python:
        print(f"{family}: llama.cpp part skipped: FSDP_TORCH_PYTHON is not set (bench/setup_torch_ref.sh with "
              "WITH_LLAMA_CPP=1 makes one)")
        return
    _, out = run(python, "-c", LLAMA_CPP, gg, IDS, "", stdout=True)
    got = json.loads(out.strip().splitlines()[-1])
    if "skip" in got:
        print(f"{family}: llama.cpp part skipped: llama-cpp-python does not import under {python} ({got['skip']})")
        return
    ours = logits("--ckpt", ck)
    theirs = np.array(got["scores"])[:, :ours.shape[1]]
    d = np.abs(ours - theirs).max() if ours.shape == theirs.shape else float("inf")
    print(f"{family}: llama.cpp's logits on the GGUF vs fsdp-generate's on the checkpoint, {len(PROMPT)} tokens: "
          f"max |diff| {d:.2e}")
    check(d < 1e-3, f"{family}: llama.cpp's logits differ from ours by {d} (shapes {ours.shape} {theirs.shape})")
    _, out = run(generate, "--ckpt", ck, "--prompt-ids", IDS, "--tokens", "20", "--temperature", "0",
                 "--ignore-eos", "--threads", "2", stdout=True)
    want = json.loads(out.strip().splitlines()[-1])
    print(f"{family}: greedy llama.cpp {got['tokens']}\n{' ' * len(family)}  fsdp-generate {want}")
    check(got["tokens"] == want, f"{family}: llama.cpp's 20 greedy tokens differ from fsdp-generate's")
    # Quantized by llama.cpp (Q8_0, experts included): read back by fsdp-generate, it is llama.cpp's
    # model on the same file, nearer to it than the unquantized one is.
    q8 = gg.replace(".gguf", ".q8_0.gguf")
    _, out = run(python, "-c", LLAMA_CPP, gg, IDS, q8, stdout=True)
    theirs_q8 = np.array(json.loads(out.strip().splitlines()[-1])["scores"])[:, :ours.shape[1]]
    types = {t.name: t.tensor_type.name for t in GGUFReader(q8).tensors}
    check(types.get("blk.0.ffn_down_exps.weight") == "Q8_0", f"{family}: llama.cpp's Q8_0 file holds {types}")
    d_q8, d_f32 = np.abs(logits("--model", q8) - theirs_q8).max(), np.abs(ours - theirs_q8).max()
    print(f"{family}: llama.cpp on its Q8_0 quantization vs fsdp-generate on the same file: max |logit diff| "
          f"{d_q8:.2e} (vs the unquantized model {d_f32:.2e})")
    check(d_q8 < d_f32, f"{family}: our reading of the Q8_0 file is {d_q8} from llama.cpp's, the f32 model {d_f32}")
    # LoRA of the attention from the GGUF (the experts frozen), its adapter exported for llama.cpp's --lora.
    lck, adapter = os.path.join(work, family + "_lora_ck"), os.path.join(work, family + ".lora.gguf")
    run(train, "--init-from", gg, *common, "--lora-rank", "4", "--lora-alpha", "8", "--ckpt-dir", lck)
    run(export, "--ckpt", lck, "--gguf-lora", adapter)
    _, out = run(python, "-c", LLAMA_CPP, gg, IDS, "", adapter, stdout=True)
    got = json.loads(out.strip().splitlines()[-1])
    ours = logits("--ckpt", lck)
    d, moved = np.abs(ours - np.array(got["scores"])[:, :ours.shape[1]]).max(), np.abs(ours - logits("--model", gg)).max()
    print(f"{family}: llama.cpp with our LoRA adapter vs fsdp-generate on the LoRA checkpoint: max |logit diff| "
          f"{d:.2e} (the adapters moved the logits {moved:.2e})")
    check(d < 1e-3 and moved > 1e-2, f"{family}: llama.cpp with our adapter is {d} from ours (moved {moved})")


for family, arch, experts, moe_ff in (("qwen3_moe", "qwen3moe", 8, 64), ("mixtral", "llama", 4, 96)):
    folder = model_folder(family, family, experts, moe_ff)
    ck, hf, gg = fine_tune(family, folder)
    check_gguf(family, gg, hf, arch, experts, moe_ff)
    read_back(family, ck, gg, hf)
    against_llama_cpp(family, ck, gg)

QUANTIZE = r"""
import sys
import llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params))
"""


def qlora():
    """LoRA of the attention on llama.cpp's Q4_K_M of a Qwen3-MoE export (256 wide: K-quant blocks),
    its base kept as those blocks (--base-quant keep, the experts' 3-D tensors too), at 1 and 2
    ranks: the losses of the dequantized-first run, bit for bit."""
    python = os.environ.get("FSDP_TORCH_PYTHON")
    rc = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode if python else 1
    if rc != 0:
        print("QLoRA part skipped: llama-cpp-python does not import under FSDP_TORCH_PYTHON (for llama-quantize)")
        return
    folder = model_folder("wide", "qwen3_moe", 4, 256, D=256, HEADS=4, HD=64)
    _, _, gg = fine_tune("wide", folder)
    q4 = os.path.join(work, "wide.q4_k_m.gguf")
    run(python, "-c", QUANTIZE, gg, q4)
    types = {t.name: t.tensor_type.name for t in GGUFReader(q4).tensors}
    exps = sorted({types[n] for n in types if "_exps" in n})
    print(f"llama.cpp's Q4_K_M: the experts' tensors are {exps}")
    check(set(exps) <= {"Q4_K", "Q6_K"} and "Q4_K" in exps, f"the Q4_K_M file's experts are {exps}")
    mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"]
    if os.geteuid() == 0:
        mpirun.insert(1, "--allow-run-as-root")
    lora = ["--init-from", q4, "--steps", "3", "--seq", "32", "--lr", "1e-2", "--sample-tokens", "0",
            "--lora-rank", "4", "--lora-alpha", "8"]
    losses, tables = {}, {}
    for np_ in (1, 2):
        for quant in ("keep", "dequantize"):
            log = os.path.join(work, f"qlora_{quant}_{np_}.jsonl")
            _, out = run(*(mpirun if np_ == 2 else []), train, *lora, "--batch", str(4 // np_), "--threads",
                         str(2 // np_), "--base-quant", quant, "--log-file", log)
            losses[quant, np_] = [json.loads(l)["loss"] for l in open(log) if l.strip()]
            tables[quant, np_] = out
    print(f"QLoRA losses: keep {losses['keep', 1]} (np 2 {losses['keep', 2]}), dequantized first "
          f"{losses['dequantize', 1]} (np 2 {losses['dequantize', 2]})")
    for np_ in (1, 2):
        check(len(losses["keep", np_]) == 3 and losses["keep", np_] == losses["dequantize", np_],
              f"np {np_}: --base-quant keep's losses {losses['keep', np_]} are not the dequantized base's "
              f"{losses['dequantize', np_]}")
    a, b = losses["keep", 1], losses["keep", 2]
    check(len(a) == 3 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)), f"QLoRA np 2 {b} != np 1 {a}")
    check(a[0] != a[-1], f"the adapters did not train: {a}")
    row = [l for l in tables["keep", 1].splitlines() if "frozen base" in l]
    print(row[0] if row else "no frozen base row")
    check(row and "Q4_K" in row[0] and "rank 4 alpha 8 on q,k,v,o" in tables["keep", 1],
          f"the table does not show the kept base or the adapters on q,k,v,o: {tables['keep', 1][:1500]}")
    # The experts stay frozen: a target naming one of their projections is refused by name.
    rc, out = run(train, *lora, "--batch", "4", "--lora-targets", "q,gate", ok=False)
    check(rc != 0 and "LoRA targets gate, up and down are not supported with moe" in out,
          f"--lora-targets q,gate on an MoE: {rc} {out[-400:]}")


qlora()

# What llama.cpp's qwen3moe cannot represent is refused by name, before a file is written.
for name, extra, says in (("nonorm", {"norm_topk_prob": False}, "norm_topk_prob false"),
                          ("dense", {"mlp_only_layers": [1]}, "1 of 2 blocks are dense")):
    folder = model_folder(name, "qwen3_moe", 4, 32, extra)
    if name == "dense":  # the dense block's own FFN
        t = load_safetensors(os.path.join(folder, "model.safetensors"))
        t = {k: v for k, v in t.items() if not k.startswith("model.layers.1.mlp.")}
        rng = np.random.default_rng(1)
        for n, s in (("gate_proj", (96, D)), ("up_proj", (96, D)), ("down_proj", (D, 96))):
            t[f"model.layers.1.mlp.{n}.weight"] = rng.normal(0, 0.1, s).astype(np.float32)
        save_safetensors(os.path.join(folder, "model.safetensors"), t)
    ck = os.path.join(work, name + "_ck")
    run(train, "--init-from", folder, *common, "--ckpt-dir", ck)
    gg = os.path.join(work, name + ".gguf")
    rc, out = run(export, "--ckpt", ck, "--gguf", gg, ok=False)
    check(rc != 0 and says in out and "qwen3moe" in out and not os.path.exists(gg),
          f"{name}: the export was not refused naming '{says}': {rc} {out[-500:]}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
