#!/usr/bin/env python3
"""Untrusted inputs bounded (issue 50, part A): JSON nested 200,000 levels in each file of a model
folder, in a chat row and in a checkpoint's metadata.json; TOML include chains, bombs and link
loops; an added or vocabulary token of 1 MB; NaN SentencePiece scores and token types out of
range; a file name that is not UTF-8. Each refusal: exit code 1, a message naming the file (or
field) and the limit, within 10 s. Tokenizing stays linear: a 60 KiB added token beside 200 kB
of text that repeats its prefix takes well under the 10 s the test allows.

usage: untrusted_input_test.py BIN_DIR   (holds fsdp-train, fsdp-generate and fsdp-tokenize)"""
import json, os, resource, subprocess, sys, tempfile, threading, time

BIN = sys.argv[1]
TRAIN, GEN, TOK = (os.path.join(BIN, n) for n in ("fsdp-train", "fsdp-generate", "fsdp-tokenize"))
tmp = tempfile.mkdtemp(prefix="untrusted_input_")
failures = []
DEEP = 200_000
V = 256


def limit():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run(args, timeout=30, cwd=None):
    """(rc, output, seconds, peak RSS in MB): rc "timeout" when killed at the time-out."""
    t0 = time.monotonic()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd,
                         preexec_fn=limit, env={"FSDP_CACHE_DIR": os.path.join(tmp, "cache"),
                                                **os.environ, "OMP_NUM_THREADS": "1"})
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    out = p.stdout.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(p.pid, 0)
    timed_out = not timer.is_alive()
    timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    rc = "timeout" if timed_out else p.returncode
    return rc, out, time.monotonic() - t0, usage.ru_maxrss / 1024


def refused(case, result, *words, within=10.0, want_rc=1):
    """Exit code 1 (a --config file and a checkpoint's flags are input files, as a model is)."""
    rc, out, took, mb = result
    ok = rc == want_rc and took < within and mb < 1024 and all(w in out for w in words) \
        and "Segmentation" not in out and "json.exception" not in out.split("not valid JSON")[0]
    tail = out.strip().replace("\n", " | ")[-260:]
    print(f"{'ok  ' if ok else 'FAIL'} {case}: rc {rc}, {took:.2f} s, {mb:.0f} MB; {tail}")
    if not ok:
        failures.append(case)


def succeeded(case, result, within=60.0, *words):
    rc, out, took, mb = result
    ok = rc == 0 and took < within and all(w in out for w in words)
    print(f"{'ok  ' if ok else 'FAIL'} {case}: rc {rc}, {took:.2f} s; {out.strip()[-200:]}")
    if not ok:
        failures.append(case)


def deep(n=DEEP):
    return "[" * n + "]" * n


def bytes_to_unicode():  # GPT-2's byte-level alphabet
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


U = bytes_to_unicode()


def tokenizer_text(normalizer="null", pre=None, added="[]", merges="[]", vocab=None):
    pre = pre or json.dumps({"type": "ByteLevel", "add_prefix_space": False,
                             "trim_offsets": True, "use_regex": True})
    vocab = vocab or json.dumps({U[i]: i for i in range(V)})
    return ('{"version": "1.0", "added_tokens": %s, "normalizer": %s, "pre_tokenizer": %s, '
            '"post_processor": null, "decoder": {"type": "ByteLevel"}, '
            '"model": {"type": "BPE", "vocab": %s, "merges": %s}}'
            % (added, normalizer, pre, vocab, merges))


CONFIG = json.dumps({"model_type": "llama", "vocab_size": V, "hidden_size": 16,
                     "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "max_position_embeddings": 64, "tie_word_embeddings": True})


def safetensors(path):
    import numpy as np
    D, F = 16, 32
    ts = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    for n, sh in [("input_layernorm", (D,)), ("post_attention_layernorm", (D,)),
                  ("self_attn.q_proj", (D, D)), ("self_attn.k_proj", (D, D)),
                  ("self_attn.v_proj", (D, D)), ("self_attn.o_proj", (D, D)),
                  ("mlp.gate_proj", (F, D)), ("mlp.up_proj", (F, D)), ("mlp.down_proj", (D, F))]:
        ts[f"model.layers.0.{n}.weight"] = sh
    rng = np.random.default_rng(0)
    hdr, data = {}, b""
    for n, sh in ts.items():
        b = (rng.standard_normal(sh) * 0.1).astype(np.float32).tobytes()
        hdr[n] = {"dtype": "F32", "shape": list(sh), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(hdr).encode()
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + data)


def folder(name, **files):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    texts = {"config.json": CONFIG, "tokenizer.json": tokenizer_text()}
    texts.update({k.replace("__", "."): v for k, v in files.items()})
    for k, v in texts.items():
        with open(os.path.join(d, k), "w") as f:
            f.write(v)
    safetensors(os.path.join(d, "model.safetensors"))
    return d


def generate(model):
    return run([GEN, "--model", model, "--prompt", "ab", "--tokens", "1", "--threads", "1"])


def train(*args, timeout=60, cwd=None):
    return run([TRAIN, "--threads", "1", *args], timeout=timeout, cwd=cwd)


# 1. JSON nested 200,000 levels: refused by name with the limit (512), in each reader.
good = folder("good")
succeeded("a well-formed Hugging Face folder generates", generate(good))
text = os.path.join(tmp, "text.txt")
with open(text, "w") as f:
    f.write("the quick brown fox jumps over the lazy dog. " * 40)
tok_cases = {
    "normalizer": tokenizer_text(normalizer=deep()),
    "pre_tokenizer": tokenizer_text(pre=deep()),
    "an added token": tokenizer_text(added="[%s]" % deep()),
    "a merge": tokenizer_text(merges="[%s]" % deep()),
    "a vocabulary id": tokenizer_text(vocab='{"a": %s}' % deep()),
}
for case, t in tok_cases.items():
    d = folder("tok_" + case.replace(" ", "_"), tokenizer__json=t)
    tj = os.path.join(d, "tokenizer.json")
    refused(f"tokenizer.json, {case} 200,000 deep: fsdp-tokenize", run([TOK, "--tokenizer", tj, text]),
            tj, "512")
    refused(f"tokenizer.json, {case} 200,000 deep: fsdp-generate", generate(d), tj, "512")
# Each deep value where the readers look: a size, an id, the template.
deep_files = {"config.json": CONFIG.replace('"hidden_size": 16', '"hidden_size": %s' % deep()),
              "generation_config.json": '{"eos_token_id": %s}' % deep(),
              "tokenizer_config.json": '{"chat_template": %s}' % deep()}
for name, deep_text in deep_files.items():
    d = folder("deep_" + name.replace(".", "_"), **{name.replace(".", "__"): deep_text})
    where = os.path.join(d, name)
    refused(f"{name} 200,000 deep: fsdp-generate", generate(d), where, "512")
    refused(f"{name} 200,000 deep: fsdp-train --init-from", train(
        "--init-from", d, "--data", text, "--seq", "16", "--batch", "1", "--steps", "1"),
        where, "512")
for field in ("input_ids", "labels"):
    rows = os.path.join(tmp, f"deep_{field}.jsonl")
    with open(rows, "w") as f:
        f.write(json.dumps({"input_ids": [1, 2, 3, 4], "labels": [1, 2, 3, 4]}) + "\n")
        row = {"input_ids": "X", "labels": [1, 2, 3, 4]} if field == "input_ids" else \
            {"input_ids": [1, 2, 3, 4], "labels": "X"}
        f.write(json.dumps(row).replace('"X"', deep()) + "\n")
    refused(f"chat row {field} 200,000 deep: fsdp-train", train(
        "--preset", "tiny", "--vocab", "256", "--seq", "8", "--batch", "1", "--steps", "1",
        "--data", rows), f"{rows}:2", "512")

# A checkpoint's metadata.json: a real one, then nested 200,000 levels and resealed.
ck = os.path.join(tmp, "ck")
small = ["--preset", "tiny", "--vocab", "256", "--dim", "32", "--layers", "1", "--heads", "2",
         "--seq", "16", "--batch", "2", "--data", text, "--sample-tokens", "0"]
succeeded("a tiny run checkpoints", train(*small, "--steps", "1", "--ckpt-dir", ck, "--ckpt-every", "1"))
steps = sorted(s for s in os.listdir(ck) if s.startswith("step_")) if os.path.isdir(ck) else []
if steps:
    sd = os.path.join(ck, steps[-1])
    meta = open(os.path.join(sd, "metadata.json")).read()
    meta = meta.replace("{", '{"deep": %s, ' % deep(), 1)
    open(os.path.join(sd, "metadata.json"), "w").write(meta)
    h = 0xcbf29ce484222325  # the seal's FNV-1a 64 (tests/edit_metadata.py)
    for b in meta.encode():
        h = ((h ^ b) * 0x100000001b3) % (1 << 64)
    c = json.load(open(os.path.join(sd, "complete.json")))
    c["metadata_checksum"] = f"{h:016x}"
    open(os.path.join(sd, "complete.json"), "w").write(json.dumps(c))
    refused("metadata.json 200,000 deep: fsdp-generate --ckpt",
            run([GEN, "--ckpt", sd, "--prompt", "ab", "--tokens", "1", "--threads", "1"]),
            "metadata.json", "512")
    refused("metadata.json 200,000 deep: fsdp-train --resume",
            train(*small, "--steps", "2", "--ckpt-dir", ck, "--resume"), "metadata.json", "512",
            want_rc=1)  # read with the run's flags, before the run
else:
    failures.append("no checkpoint to forge")

# Just under the limit is read; just over is refused, naming line and column.
d = folder("depth_511", generation_config__json='{"a": %s}' % deep(510))
succeeded("generation_config.json 511 deep is read", generate(d))
d = folder("depth_513", generation_config__json='{"a": %s}' % deep(512))
refused("generation_config.json 513 deep", generate(d), "512", "line 1, column 518")

# 2. TOML includes: a 10,000-long chain, a bomb of 30 files each including the next twice, a link
# loop, a NUL in a key.
chain = os.path.join(tmp, "chain")
os.makedirs(chain)
for i in range(10_000):
    with open(os.path.join(chain, f"c{i}.toml"), "w") as f:
        f.write(f'include = "c{i + 1}.toml"\n' if i < 9_999 else "[run]\nthreads = 1\n")
refused("a TOML include chain of 10,000", train("--config", os.path.join(chain, "c0.toml")),
        "nest deeper than 64", "c0.toml", want_rc=1)
bomb = os.path.join(tmp, "bomb")
os.makedirs(bomb)
for i in range(30):
    with open(os.path.join(bomb, f"b{i}.toml"), "w") as f:
        f.write(f'include = ["b{i + 1}.toml", "b{i + 1}.toml"]\n' if i < 29 else "[run]\nthreads = 1\n")
refused("a TOML include bomb (30 files, each including the next twice)",
        train("--config", os.path.join(bomb, "b0.toml")), "more than 1000 files", "b0.toml",
        want_rc=1)
loop = os.path.join(tmp, "loop")
os.makedirs(loop)
os.symlink("l2.toml", os.path.join(loop, "l1.toml"))
os.symlink("l1.toml", os.path.join(loop, "l2.toml"))
with open(os.path.join(loop, "main.toml"), "w") as f:
    f.write('include = "l1.toml"\n')
refused("a TOML include through a link loop", train("--config", os.path.join(loop, "main.toml")),
        "loop of symbolic links", "l1.toml", want_rc=1)
with open(os.path.join(tmp, "nul.toml"), "w") as f:
    f.write('[run]\n"thr\\u0000eads" = 1\n')
refused("a NUL in a TOML key", train("--config", os.path.join(tmp, "nul.toml")),
        "thr\\x00eads", "has no key", want_rc=1)

# 3. Long tokens: refused above 64 KiB by name; tokenizing stays linear below it.
big = "a" * (1 << 20)
tj = os.path.join(tmp, "added_1mb.json")
open(tj, "w").write(tokenizer_text(added=json.dumps(
    [{"id": V, "content": big, "special": False, "normalized": False}])))
refused("an added token of 1 MB", run([TOK, "--tokenizer", tj, text]), "added_tokens[0]", "65536")
vocab = {U[i]: i for i in range(V)}
vocab["a" * (1 << 20)] = V
tj = os.path.join(tmp, "vocab_1mb.json")
open(tj, "w").write(tokenizer_text(vocab=json.dumps(vocab)))
refused("a vocabulary token of 1 MB", run([TOK, "--tokenizer", tj, text]), f"id {V}", "65536")
tj = os.path.join(tmp, "added_60k.json")
long_token = "a" * 60_000 + "b"
open(tj, "w").write(tokenizer_text(added=json.dumps(
    [{"id": V, "content": long_token, "special": False, "normalized": False},
     {"id": V + 1, "content": "aab", "special": False, "normalized": False}])))
for n in (20_000, 200_000):
    body = os.path.join(tmp, f"a_{n}.txt")
    open(body, "w").write("a" * n + "c" + long_token)
    rc, out, took, _ = run([TOK, "--tokenizer", tj, body])
    ids = out.split()
    # every 'a' its byte's token, then 'c', then the long token (not "aab" inside it)
    ok = rc == 0 and took < 10 and ids[-2:] == [str(ord("c")), str(V)] and len(ids) == n + 2
    print(f"{'ok  ' if ok else 'FAIL'} {n // 1000} kB of text beside a 60 kB added token: rc {rc}, {took:.2f} s")
    if not ok:
        failures.append(f"linear {n}")

try:
    import gguf
    import numpy as np

    def spm_gguf(path, tokens, scores=None, types=None):
        w = gguf.GGUFWriter(path, "llama")
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_embedding_length(16)
        w.add_feed_forward_length(32)
        w.add_head_count(2)
        w.add_head_count_kv(2)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores if scores is not None else [-float(i) for i in range(len(tokens))])
        w.add_token_types(types if types is not None else [1] * len(tokens))
        rng = np.random.default_rng(0)
        n = len(tokens)
        for name, sh in [("token_embd.weight", (n, 16)), ("output_norm.weight", (16,)),
                         ("blk.0.attn_norm.weight", (16,)), ("blk.0.ffn_norm.weight", (16,)),
                         ("blk.0.attn_q.weight", (16, 16)), ("blk.0.attn_k.weight", (16, 16)),
                         ("blk.0.attn_v.weight", (16, 16)), ("blk.0.attn_output.weight", (16, 16)),
                         ("blk.0.ffn_gate.weight", (32, 16)), ("blk.0.ffn_up.weight", (32, 16)),
                         ("blk.0.ffn_down.weight", (16, 32))]:
            w.add_tensor(name, (rng.standard_normal(sh) * 0.1).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    base = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "a", "b", "ab"]
    p = os.path.join(tmp, "spm_good.gguf")
    spm_gguf(p, base)
    succeeded("a SentencePiece GGUF generates", generate(p))
    p = os.path.join(tmp, "spm_1mb.gguf")
    spm_gguf(p, base + ["a" * (1 << 20)])
    refused("a 1 MB token in a SentencePiece GGUF", generate(p), f"tokenizer.ggml.tokens[{len(base)}]",
            "65536")
    p = os.path.join(tmp, "spm_60k.gguf")
    spm_gguf(p, base + ["a" * 60_000])
    succeeded("a 60 kB token in a SentencePiece GGUF loads", generate(p), 10.0)
    scores = [-float(i) for i in range(len(base))]
    scores[261] = float("nan")
    p = os.path.join(tmp, "spm_nan.gguf")
    spm_gguf(p, base, scores=scores)
    refused("a NaN SentencePiece score", generate(p), "tokenizer.ggml.scores[261]", "NaN")
    for bad in (99, -5, 2**31 - 1):
        types = [1] * len(base)
        types[260] = bad
        p = os.path.join(tmp, f"spm_type_{bad}.gguf")
        spm_gguf(p, base, types=types)
        refused(f"token type {bad}", generate(p), "tokenizer.ggml.token_type[260]", str(bad))
except ImportError:
    print("skip the GGUF cases: the gguf package is missing (scripts/install-deps.sh)")

# 4. A file name that is not UTF-8 trains, checkpoints and logs; the JSON holds it escaped.
odd = os.path.join(tmp.encode(), b"data\xff.txt")
with open(odd, "wb") as f:
    f.write(open(text, "rb").read())
ck2 = os.path.join(tmp, "ck_odd")
log = os.path.join(tmp, "odd.jsonl")
r = run([TRAIN.encode(), b"--threads", b"1", *[a.encode() for a in small[:-4]], b"--data", odd,
         b"--sample-tokens", b"0", b"--steps", b"2", b"--ckpt-dir", ck2.encode(), b"--log-file",
         log.encode(), b"--ckpt-every", b"1"])
succeeded("a --data name that is not UTF-8 trains and checkpoints", r)
metas = [os.path.join(ck2, s, "metadata.json") for s in os.listdir(ck2)] if os.path.isdir(ck2) else []
ok = any(os.path.exists(m) and "data\\\\xFF.txt" in open(m, encoding="utf-8").read() for m in metas)
print(f"{'ok  ' if ok else 'FAIL'} the checkpoint's metadata.json names it escaped (data\\xFF.txt)")
if not ok:
    failures.append("escaped name in metadata")

print(f"{len(failures)} failed: {failures}" if failures else "all passed")
sys.exit(1 if failures else 0)
