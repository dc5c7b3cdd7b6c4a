#!/usr/bin/env python3
"""From training to use, held to the outside tools that read the files:
  - a BPE tokenizer trained by prepare_text.py goes through fsdp-train's checkpoint into
    fsdp-export's Hugging Face folder and GGUF;
  - the GGUF, read with the `gguf` package (llama.cpp's own Python reader), holds what
    llama.cpp expects of a "gpt2" vocabulary: the tokenizer's tokens by id, its merges,
    token types, BOS/EOS, the "gpt-2" pre-tokenizer, no BOS added; and the tensors the
    safetensors export holds;
  - the byte vocabulary becomes a "gpt2" vocabulary too, with a merge that cannot apply
    and distinct control tokens for BOS and EOS;
  - Hugging Face tokenizers loads the folder's tokenizer.json and encodes a prompt to the
    ids fsdp-generate uses;
  - fsdp-generate reads the checkpoint, the export and a plain Hugging Face folder (no fsdp
    metadata) to the same logits and the same greedy text, text alone on stdout;
  - where transformers and torch are installed, LlamaForCausalLM loads the folder and
    gives the same logits and greedy continuation (skipped with a note otherwise).
usage: export_test.py BIN_DIR SCRIPTS_DIR REPO"""
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

try:
    from gguf import GGUFReader
    from tokenizers import Tokenizer
except ImportError as e:
    sys.exit(f"export_test: {e.name} is missing; run scripts/install-deps.sh")

bins, scripts, repo = sys.argv[1:4]
fails, passes = [], 0
env = dict(os.environ, OMP_NUM_THREADS="2")


def check(cond, what):
    global passes
    if cond:
        passes += 1
    else:
        fails.append(what)


def run(*args, ok=True):
    r = subprocess.run([str(a) for a in args], capture_output=True, env=env)
    if ok and r.returncode != 0:
        sys.exit(f"export_test: {' '.join(map(str, args[:3]))} failed:\n{r.stderr.decode()[-2000:]}")
    return r


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    if f.types[0].name == "ARRAY":
        if f.types[-1].name == "STRING":
            return [bytes(f.parts[i]).decode() for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0].name == "STRING":
        return bytes(f.parts[f.data[0]]).decode()
    return f.parts[f.data[0]].tolist()[0]


def safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, e = v["data_offsets"]
        assert v["dtype"] == "F32", v["dtype"]
        out[k] = np.frombuffer(b[8 + n + a:8 + n + e], dtype=np.float32).reshape(v["shape"])
    return header, out


def gpt2_bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


train, export, gen = (os.path.join(bins, n) for n in ("fsdp-train", "fsdp-export", "fsdp-generate"))
model_flags = ["--preset", "tiny", "--arch", "llama", "--dim", "64", "--layers", "2", "--heads", "4",
               "--seq", "64", "--batch", "4", "--threads", "2", "--sample-tokens", "0"]

with tempfile.TemporaryDirectory() as w:
    corpus = sorted(glob.glob(os.path.join(repo, "*.md")) + glob.glob(os.path.join(repo, "docs", "*.md")))
    run(sys.executable, os.path.join(scripts, "prepare_text.py"), *corpus, "--out", f"{w}/data",
        "--tokenizer", "bpe", "--vocab-size", "600")
    run(train, *model_flags, "--vocab", "640", "--data", f"{w}/data/train_000000.bin", "--steps", "60",
        "--lr", "3e-3", "--ckpt-dir", f"{w}/ck", "--ckpt-every", "60")
    ck = f"{w}/ck/step_00000060"
    check(open(f"{ck}/tokenizer.json").read() == open(f"{w}/data/tokenizer.json").read(),
          "the checkpoint holds the data's tokenizer.json")
    meta = json.load(open(f"{ck}/metadata.json"))
    check("tokenizer.json" in meta["files"] and "byte-level BPE" in meta["config"]["tokenizer"],
          f"the metadata records the tokenizer: {meta['config'].get('tokenizer')}")
    run(export, "--ckpt", f"{w}/ck", "--out", f"{w}/hf/model.safetensors", "--gguf", f"{w}/m.gguf")
    hf_tok = Tokenizer.from_file(f"{w}/hf/tokenizer.json")
    vocab = {i: t for t, i in json.load(open(f"{w}/data/tokenizer.json"))["model"]["vocab"].items()}
    merges = [" ".join(m) if isinstance(m, list) else m
              for m in json.load(open(f"{w}/data/tokenizer.json"))["model"]["merges"]]

    # GGUF through llama.cpp's reader.
    g = GGUFReader(f"{w}/m.gguf")
    tokens = field(g, "tokenizer.ggml.tokens")
    types = field(g, "tokenizer.ggml.token_type")
    check(field(g, "general.architecture") == "llama", "GGUF architecture llama")
    check(field(g, "tokenizer.ggml.model") == "gpt2", f"GGUF tokenizer model {field(g, 'tokenizer.ggml.model')}")
    check(field(g, "tokenizer.ggml.pre") == "gpt-2", f"GGUF pre {field(g, 'tokenizer.ggml.pre')}")
    check(len(tokens) == 640 == len(types) == field(g, "llama.vocab_size"), "GGUF vocab has the model's 640 ids")
    check(all(tokens[i] == vocab[i] for i in vocab), "GGUF tokens are the tokenizer's, by id")
    check(all(tokens[i].startswith("<unused") and types[i] == 5 for i in range(len(vocab), 640)),
          "ids past the tokenizer are UNUSED")
    check(field(g, "tokenizer.ggml.merges") == merges, "GGUF merges are the tokenizer's, in rank order")
    eot = hf_tok.token_to_id("<|endoftext|>")
    check(types[eot] == 3 and all(types[i] == 1 for i in vocab if i != eot), "token types: <|endoftext|> CONTROL, the rest NORMAL")
    check(field(g, "tokenizer.ggml.bos_token_id") == eot == field(g, "tokenizer.ggml.eos_token_id"),
          "BOS and EOS are <|endoftext|>")
    check(field(g, "tokenizer.ggml.add_bos_token") is False, "no BOS added")
    _, st = safetensors(f"{w}/hf/model.safetensors")
    tensors = {t.name: t for t in g.tensors}
    emb = tensors["token_embd.weight"]
    check(list(emb.shape) == [64, 640], f"token_embd shape {list(emb.shape)}")
    check(np.array_equal(np.asarray(emb.data).reshape(640, 64), st["model.embed_tokens.weight"]),
          "GGUF token_embd equals the safetensors embedding")
    check(np.array_equal(np.asarray(tensors["blk.1.ffn_down.weight"].data).reshape(64, -1),
                         st["model.layers.1.mlp.down_proj.weight"]), "GGUF ffn_down equals the safetensors one")

    # Hugging Face folder: config files and the tokenizer.
    cfg = json.load(open(f"{w}/hf/config.json"))
    tcfg = json.load(open(f"{w}/hf/tokenizer_config.json"))
    gcfg = json.load(open(f"{w}/hf/generation_config.json"))
    check(cfg["eos_token_id"] == eot and gcfg["eos_token_id"] == eot and tcfg["eos_token"] == "<|endoftext|>"
          and tcfg["add_bos_token"] is False, "config, generation and tokenizer configs name EOS")
    prompt = "The license, the software and “its” café 42"
    logits = {}
    for name, args in (("ckpt", ["--ckpt", f"{w}/ck"]), ("export", ["--model", f"{w}/hf/model.safetensors"])):
        out = json.loads(run(gen, *args, "--prompt", prompt, "--print-logits").stdout)
        logits[name] = out
    check(logits["ckpt"]["ids"] == hf_tok.encode(prompt).ids, "fsdp-generate encodes as Hugging Face tokenizers")
    check(np.allclose(logits["ckpt"]["logits"], logits["export"]["logits"], rtol=0, atol=1e-5),
          "the export's logits equal the checkpoint's")

    # A plain Hugging Face folder: the same tensors without our metadata.
    os.makedirs(f"{w}/plain")
    raw = open(f"{w}/hf/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(f"{w}/plain/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
    for f in ("config.json", "tokenizer.json"):
        open(f"{w}/plain/{f}", "w").write(open(f"{w}/hf/{f}").read())
    plain = json.loads(run(gen, "--model", f"{w}/plain", "--prompt", prompt, "--print-logits").stdout)
    check(np.allclose(plain["logits"], logits["ckpt"]["logits"], rtol=0, atol=1e-5),
          "a plain Hugging Face folder gives the same logits")
    texts = [run(gen, *a, "--prompt", "The software", "--tokens", "30", "--temperature", "0", "--ignore-eos").stdout
             for a in (["--ckpt", f"{w}/ck"], ["--model", f"{w}/plain"], ["--ckpt", f"{w}/ck", "--no-kv-cache"])]
    check(texts[0] == texts[1] == texts[2] and texts[0].startswith(b"The software"),
          f"greedy text equal from the checkpoint, the plain folder and without the KV cache: {texts}")
    check(b"generate:" not in texts[0], "status lines stay off stdout")
    open(f"{w}/t.txt", "w").write(open(corpus[0]).read()[:20000])
    os.makedirs(f"{w}/scaled")
    json.dump(dict(cfg, rope_scaling={"rope_type": "linear", "factor": 2.0}), open(f"{w}/scaled/config.json", "w"))
    os.link(f"{w}/plain/model.safetensors", f"{w}/scaled/model.safetensors")
    r = run(gen, "--model", f"{w}/scaled", "--tokens", "1", ok=False)
    check(r.returncode != 0 and b"rope_scaling" in r.stderr,
          f"rope scaling refused by name: {r.stderr.decode()[-300:]}")
    # Llama 3's scaling is read; one without its original context, or with a factor below 1, is
    # refused naming the field.
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    for tag, scaling, says in (("ok", llama3, None),
                               ("no-context", {k: v for k, v in llama3.items() if k != "original_max_position_embeddings"},
                                b"has no 'original_max_position_embeddings'"),
                               ("factor", dict(llama3, factor=0.5), b"rope scaling factor 0.5 must be at least 1")):
        os.makedirs(f"{w}/llama3-{tag}")
        plain_cfg = {k: v for k, v in cfg.items() if k != "rope_parameters"}  # (it would disagree)
        json.dump(dict(plain_cfg, rope_scaling=scaling), open(f"{w}/llama3-{tag}/config.json", "w"))
        os.link(f"{w}/plain/model.safetensors", f"{w}/llama3-{tag}/model.safetensors")
        r = run(gen, "--model", f"{w}/llama3-{tag}", "--prompt", "The software", "--print-logits", ok=False)
        if says is None:
            plain_logits = json.loads(run(gen, "--model", f"{w}/plain", "--prompt", "The software",
                                          "--print-logits").stdout)["logits"]
            check(r.returncode == 0 and json.loads(r.stdout)["logits"] != plain_logits,
                  f"a llama3-scaled folder is read, to other logits than unscaled: {r.stderr.decode()[-300:]}")
        else:
            check(r.returncode != 0 and says in r.stderr and b"rope_scaling" in r.stderr,
                  f"llama3 scaling ({tag}) refused by name: {r.stderr.decode()[-300:]}")
    os.makedirs(f"{w}/gqa")
    json.dump(dict(cfg, num_key_value_heads=2), open(f"{w}/gqa/config.json", "w"))
    os.link(f"{w}/plain/model.safetensors", f"{w}/gqa/model.safetensors")
    r = run(gen, "--model", f"{w}/gqa", "--tokens", "1", ok=False)
    check(r.returncode != 0 and b"k_proj.weight' has shape [64, 64]" in r.stderr,
          f"a config whose kv heads do not fit the weights is refused by name: {r.stderr.decode()[-300:]}")

    # The llama family's options (SmolLM2's shape, small): grouped-query attention, a head dim of
    # its own, rope theta 1e5 and the head tied to the embedding; and Qwen2's q/k/v biases.
    for tag, extra in (("smol", ["--kv-heads", "2", "--head-dim", "8", "--rope-theta", "100000", "--tie-embeddings"]),
                       ("qwen", ["--kv-heads", "1", "--qkv-bias"]),
                       ("qwen3", ["--kv-heads", "2", "--head-dim", "16", "--qk-norm"])):
        run(train, *model_flags, *extra, "--vocab", "300", "--data", f"{w}/t.txt", "--steps", "2",
            "--ckpt-dir", f"{w}/{tag}ck", "--ckpt-every", "2")
        run(export, "--ckpt", f"{w}/{tag}ck", "--out", f"{w}/{tag}/model.safetensors", "--gguf", f"{w}/{tag}.gguf")
        c = json.load(open(f"{w}/{tag}/config.json"))
        header, st = safetensors(f"{w}/{tag}/model.safetensors")
        gg = GGUFReader(f"{w}/{tag}.gguf")
        gt = {t.name: t for t in gg.tensors}
        arch = "qwen2" if tag == "qwen" else "llama"
        if tag == "smol":
            check(c["num_key_value_heads"] == 2 and c["head_dim"] == 8 and c["tie_word_embeddings"] is True
                  and c["rope_theta"] == 100000 and c["model_type"] == "llama",
                  f"smol config.json: {c}")
            check("lm_head.weight" not in st and list(st["model.layers.0.self_attn.q_proj.weight"].shape) == [32, 64]
                  and list(st["model.layers.0.self_attn.k_proj.weight"].shape) == [16, 64]
                  and list(st["model.layers.0.self_attn.o_proj.weight"].shape) == [64, 32],
                  f"smol tensors: {sorted((k, v.shape) for k, v in st.items() if 'layers.0.' in k or 'head' in k)}")
            check(field(gg, "llama.attention.head_count_kv") == 2 and field(gg, "llama.rope.dimension_count") == 8
                  and field(gg, "llama.rope.freq_base") == 100000 and "output.weight" not in gt,
                  "smol GGUF: head_count_kv 2, rope dims 8, freq base 1e5, no output.weight (tied)")
        elif tag == "qwen3":
            check(c["model_type"] == "qwen3" and c["head_dim"] == 16 and "model.layers.0.self_attn.q_norm.weight" in st
                  and field(gg, "general.architecture") == "qwen3" and field(gg, "qwen3.attention.key_length") == 16
                  and "blk.0.attn_q_norm.weight" in gt, f"qwen3 config.json and GGUF: {c}")
        else:
            check(c["model_type"] == "qwen2" and c["num_key_value_heads"] == 1 and c["tie_word_embeddings"] is False,
                  f"qwen config.json: {c}")
            check(list(st["model.layers.0.self_attn.k_proj.bias"].shape) == [16] and "lm_head.weight" in st
                  and "model.layers.0.self_attn.o_proj.bias" not in st, "qwen tensors: q/k/v biases, no o_proj bias")
            check(field(gg, "general.architecture") == "qwen2" and field(gg, "qwen2.attention.head_count_kv") == 1
                  and "blk.0.attn_k.bias" in gt and "output.weight" in gt, "qwen GGUF: qwen2, head_count_kv 1, biases")
        # A plain Hugging Face folder of it (no fsdp metadata) gives the checkpoint's logits.
        os.makedirs(f"{w}/{tag}plain")
        raw = open(f"{w}/{tag}/model.safetensors", "rb").read()
        header.pop("__metadata__", None)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        n = struct.unpack("<Q", raw[:8])[0]
        open(f"{w}/{tag}plain/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
        open(f"{w}/{tag}plain/config.json", "w").write(open(f"{w}/{tag}/config.json").read())
        a = json.loads(run(gen, "--ckpt", f"{w}/{tag}ck", "--prompt", "The software", "--print-logits").stdout)
        b = json.loads(run(gen, "--model", f"{w}/{tag}plain", "--prompt", "The software", "--print-logits").stdout)
        check(np.allclose(a["logits"], b["logits"], rtol=0, atol=1e-5),
              f"{tag}: a plain Hugging Face folder gives the checkpoint's logits")
        # Its GGUF export, read back (llama, qwen2, qwen3 by their family's keys).
        g = json.loads(run(gen, "--model", f"{w}/{tag}.gguf", "--prompt", "The software", "--print-logits").stdout)
        check(g.get("prompt_ids", g.get("ids")) == a.get("prompt_ids", a.get("ids"))
              and np.allclose(a["logits"], g["logits"], rtol=0, atol=1e-5),
              f"{tag}: its GGUF export read back gives the checkpoint's ids and logits")
        texts = [run(gen, "--ckpt", f"{w}/{tag}ck", "--prompt", "The software", "--tokens", "20", "--temperature", "0",
                     "--ignore-eos", *nk).stdout for nk in ([], ["--no-kv-cache"])]
        check(texts[0] == texts[1], f"{tag}: greedy text equal with and without the KV cache: {texts}")
    r = run(gen, "--model", f"{w}/nothing", "--tokens", "1", ok=False)
    check(r.returncode != 0 and b"fsdp-generate: error" in r.stderr, "a missing model is refused")

    # The byte vocabulary as a gpt2 vocabulary.
    run(train, *model_flags, "--vocab", "300", "--data", f"{w}/t.txt", "--steps", "2",
        "--ckpt-dir", f"{w}/bk", "--ckpt-every", "2")
    run(export, "--ckpt", f"{w}/bk", "--gguf", f"{w}/b.gguf")
    b = GGUFReader(f"{w}/b.gguf")
    bt, btypes = field(b, "tokenizer.ggml.tokens"), field(b, "tokenizer.ggml.token_type")
    b2u = gpt2_bytes_to_unicode()
    check(all(bt[i] == b2u[i] for i in range(256)), "byte tokens in GPT-2's byte-level form")
    check(field(b, "tokenizer.ggml.merges") == ["a 1"], "one merge that GPT-2's split never applies")
    bos, eos = field(b, "tokenizer.ggml.bos_token_id"), field(b, "tokenizer.ggml.eos_token_id")
    check(bos == 256 and eos == 257 and btypes[bos] == 3 and btypes[eos] == 3,
          f"distinct control BOS/EOS in unused ids: {bos} {eos}")

    # transformers, where it is installed.
    try:
        import torch
        from transformers import AutoTokenizer, LlamaForCausalLM
    except Exception as e:
        print(f"note: transformers/torch not importable ({e}); skipped the Hugging Face model load")
    else:
        m = LlamaForCausalLM.from_pretrained(f"{w}/hf", torch_dtype=torch.float32)
        at = AutoTokenizer.from_pretrained(f"{w}/hf")
        ids = at(prompt)["input_ids"]
        check(ids == logits["ckpt"]["ids"], "transformers' tokenizer encodes as we do")
        with torch.no_grad():
            ref = m(torch.tensor([ids])).logits[0].numpy()
        check(np.allclose(ref, logits["ckpt"]["logits"], rtol=0, atol=3e-5),
              f"transformers' logits: max diff {np.abs(ref - np.array(logits['ckpt']['logits'])).max()}")
        out = m.generate(torch.tensor([at("The software")["input_ids"]]), max_new_tokens=30, do_sample=False)
        theirs = at.decode(out[0]).encode()
        check(theirs == texts[0][:-1], f"transformers' greedy continuation: {theirs!r} vs {texts[0]!r}")

print(f"export_test: {passes} passed, {len(fails)} failed")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
