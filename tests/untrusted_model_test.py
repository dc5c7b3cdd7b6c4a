#!/usr/bin/env python3
"""Untrusted model files: crafted GGUF / Hugging Face folders are refused by name, before any
module or buffer is built from their sizes, and never by a crash or std::bad_alloc.

usage: untrusted_model_test.py BIN_DIR   (holds fsdp-generate)"""
import json, os, resource, subprocess, sys, tempfile
import numpy as np
import gguf

BIN = sys.argv[1]
GEN = os.path.join(BIN, "fsdp-generate")
tmp = tempfile.mkdtemp(prefix="untrusted_model_")
failures = []

V, D, F, H, L = 256, 16, 256, 2, 2  # F: ffn_down's rows are one Q6_K block (256) long


def write_gguf(path, block_count=L, nan_in=None, vocab_kv=None, eos=None, n_tokens=V,
               q8_nan_scale=None, nan_scale=None, layers=None, ffn_kv=F):
    """nan_scale: (tensor, "Q4_0" | "Q6_K"), that tensor quantized with its first block's scale
    NaN. layers: the blk.N indices written (default 0..L-1)."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(block_count)
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_feed_forward_length(ffn_kv)
    w.add_head_count(H)
    w.add_head_count_kv(H)
    w.add_layer_norm_rms_eps(1e-5)
    if vocab_kv is not None:
        w.add_vocab_size(vocab_kv)
    if eos is not None:
        w.add_tokenizer_model("gpt2")
        toks = [f"t{i}" for i in range(n_tokens)]
        w.add_token_list(toks)
        w.add_eos_token_id(eos)
    rng = np.random.default_rng(0)

    def t(name, shape):
        a = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if name == nan_in:
            a.flat[3] = np.nan
        if name == q8_nan_scale:  # Q8_0 blocks: an f16 scale, then 32 int8; the first scale NaN
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            q.reshape(-1)[0:2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            return
        if nan_scale and name == nan_scale[0]:
            kind = getattr(gguf.GGMLQuantizationType, nan_scale[1])
            nan16 = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
            if nan_scale[1] == "Q4_0":  # 18-byte blocks of 32: the f16 scale first
                q = gguf.quants.quantize(a, kind)
                q.reshape(-1)[0:2] = nan16
            else:  # Q6_K, 210-byte blocks of 256: ql, qh, 16 scales, then the f16 scale d
                q = rng.integers(0, 256, (shape[0], shape[1] // 256 * 210), dtype=np.uint8)
                q[:, 208::210] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)[0]
                q[:, 209::210] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)[1]
                q.reshape(-1)[208:210] = nan16
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=kind)
            return
        w.add_tensor(name, a)

    t("token_embd.weight", (V, D))
    t("output_norm.weight", (D,))
    for i in (range(L) if layers is None else layers):
        for n, s in [("attn_norm", (D,)), ("ffn_norm", (D,)), ("attn_q", (D, D)),
                     ("attn_k", (D, D)), ("attn_v", (D, D)), ("attn_output", (D, D)),
                     ("ffn_gate", (F, D)), ("ffn_up", (F, D)), ("ffn_down", (D, F))]:
            t(f"blk.{i}.{n}.weight", s)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def limit():
    resource.setrlimit(resource.RLIMIT_AS, (2_000_000 * 1024, 2_000_000 * 1024))


def generate(model, *extra):
    return subprocess.run([GEN, "--model", model, "--tokenizer", "bytes", "--prompt", "ab",
                           "--tokens", "2", "--threads", "1", *extra], capture_output=True,
                          text=True, errors="replace", timeout=60, preexec_fn=limit)


def refused(case, r, *words):
    out = r.stdout + r.stderr
    ok = (r.returncode > 0 and "bad_alloc" not in out and "check " not in out
          and all(w in out for w in words))
    print(f"{'ok  ' if ok else 'FAIL'} {case}: rc {r.returncode}; {out.strip()[-300:]}")
    if not ok:
        failures.append(case)


good = os.path.join(tmp, "good.gguf")
write_gguf(good)
r = generate(good, "--print-logits")
print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} a well-formed GGUF generates: rc {r.returncode} {r.stderr[-300:]}")
if r.returncode != 0:
    failures.append("good")

# Item 11: NaN in a weight, refused at load for inference, naming the tensor.
p = os.path.join(tmp, "nan.gguf")
write_gguf(p, nan_in="token_embd.weight")
refused("NaN in token_embd.weight", generate(p, "--print-logits"), "token_embd.weight", "NaN")
p = os.path.join(tmp, "nan_blk.gguf")
write_gguf(p, nan_in="blk.1.ffn_down.weight")
refused("NaN in blk.1.ffn_down.weight", generate(p), "blk.1.ffn_down.weight", "NaN")

p = os.path.join(tmp, "q8_nan.gguf")
write_gguf(p, q8_nan_scale="blk.0.ffn_down.weight")
refused("Q8_0 block with a NaN scale", generate(p), "blk.0.ffn_down.weight", "NaN")

for kind in ("Q4_0", "Q6_K"):
    p = os.path.join(tmp, f"{kind}_nan.gguf")
    write_gguf(p, nan_scale=("blk.1.ffn_down.weight", kind))
    refused(f"{kind} block with a NaN scale", generate(p), "blk.1.ffn_down.weight", "NaN")

# Item 9: a header's layer count with no tensors behind it, under a 2 GB address space.
for n in (100_000, 1_000_000, 2**31 - 1):
    p = os.path.join(tmp, f"layers_{n}.gguf")
    write_gguf(p, block_count=n)
    refused(f"block_count {n}", generate(p), "block_count", f"blk.{n - 1}.")
# ... or with its first and its last layer only: every layer must be there.
p = os.path.join(tmp, "first_and_last.gguf")
write_gguf(p, block_count=1_000_000, layers=[0, 999_999])
refused("block_count 1e6 over layers 0 and 999999", generate(p), "block_count",
        "only 2 distinct layers")
# A width from the header, held to the tensors before anything is built.
p = os.path.join(tmp, "ffn.gguf")
write_gguf(p, ffn_kv=10**9)
refused("feed_forward_length 1e9 over 256-row tensors", generate(p), "blk.0.ffn_gate.weight",
        "has shape")
p = os.path.join(tmp, "vocab.gguf")
write_gguf(p, vocab_kv=10**9)
refused("vocab_size 1e9 with a 256-row embedding", generate(p), "token_embd.weight")

# Item 5: an index with an empty weight_map is a named error, not SIGSEGV.
d = os.path.join(tmp, "empty_index")
os.makedirs(d)
json.dump({"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F,
           "num_hidden_layers": L, "num_attention_heads": H, "max_position_embeddings": 64},
          open(os.path.join(d, "config.json"), "w"))
json.dump({"weight_map": {}}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
refused("empty weight_map", generate(d), "weight_map")
# Item 9: an HF config with 1e6 layers and no weights behind them.
d = os.path.join(tmp, "hf_layers")
os.makedirs(d)
json.dump({"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F,
           "num_hidden_layers": 1_000_000, "num_attention_heads": H,
           "max_position_embeddings": 64}, open(os.path.join(d, "config.json"), "w"))
json.dump({"weight_map": {"model.embed_tokens.weight": "model.safetensors"}},
          open(os.path.join(d, "model.safetensors.index.json"), "w"))
# A minimal safetensors: header + one f32 embedding.
emb = np.zeros((V, D), np.float32).tobytes()
hdr = json.dumps({"model.embed_tokens.weight": {"dtype": "F32", "shape": [V, D],
                                                "data_offsets": [0, len(emb)]}}).encode()
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(len(hdr).to_bytes(8, "little") + hdr + emb)
refused("num_hidden_layers 1e6", generate(d), "num_hidden_layers", "model.layers.999999.")

# Item 5: token ids outside the vocabulary are refused at load.
p = os.path.join(tmp, "eos.gguf")
write_gguf(p, eos=300)
r = subprocess.run([GEN, "--model", p, "--prompt", "ab", "--tokens", "2"], capture_output=True,
                   text=True, errors="replace", timeout=60, preexec_fn=limit)
refused("eos_token_id 300 of 256", r, "eos_token_id")
# generation_config.json's ids outside config.json's vocabulary (a Hugging Face folder).
def bytes_to_unicode():  # GPT-2's byte-level alphabet
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_hf(d, gen, nan_in=None):
    os.makedirs(d)
    json.dump({"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F,
               "num_hidden_layers": L, "num_attention_heads": H, "max_position_embeddings": 64,
               "tie_word_embeddings": True}, open(os.path.join(d, "config.json"), "w"))
    json.dump(gen, open(os.path.join(d, "generation_config.json"), "w"))
    u = bytes_to_unicode()
    json.dump({"version": "1.0", "added_tokens": [], "normalizer": None,
               "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                 "trim_offsets": True, "use_regex": True},
               "post_processor": None, "decoder": {"type": "ByteLevel"},
               "model": {"type": "BPE", "vocab": {u[i]: i for i in range(V)}, "merges": []}},
              open(os.path.join(d, "tokenizer.json"), "w"))
    rng = np.random.default_rng(0)
    ts = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    for i in range(L):
        for n, sh in [("input_layernorm", (D,)), ("post_attention_layernorm", (D,)),
                      ("self_attn.q_proj", (D, D)), ("self_attn.k_proj", (D, D)),
                      ("self_attn.v_proj", (D, D)), ("self_attn.o_proj", (D, D)),
                      ("mlp.gate_proj", (F, D)), ("mlp.up_proj", (F, D)),
                      ("mlp.down_proj", (D, F))]:
            ts[f"model.layers.{i}.{n}.weight"] = sh
    hdr, data = {}, b""
    for n, sh in ts.items():
        a = (rng.standard_normal(sh) * 0.1).astype(np.float32)
        if n == nan_in:
            a.flat[1] = np.inf
        b = a.tobytes()
        hdr[n] = {"dtype": "F32", "shape": list(sh), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(hdr).encode()
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + data)


d = os.path.join(tmp, "hf_good")
write_hf(d, {"eos_token_id": 5})
r = generate(d)
print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} a well-formed HF folder generates: rc {r.returncode} {r.stderr[-300:]}")
if r.returncode != 0:
    failures.append("hf_good")
d = os.path.join(tmp, "hf_inf")
write_hf(d, {}, nan_in="model.layers.1.mlp.up_proj.weight")
refused("Inf in a safetensors weight", generate(d, "--print-logits"),
        "model.layers.1.mlp.up_proj.weight", "Inf")
d = os.path.join(tmp, "hf_eos")
write_hf(d, {"eos_token_id": 300})
refused("generation_config eos_token_id 300 of 256", generate(d), "eos_token_id", "300")
d = os.path.join(tmp, "hf_bos")
write_hf(d, {"bos_token_id": -7})
refused("generation_config bos_token_id -7", generate(d), "bos_token_id", "-7")

if failures:
    sys.exit(f"untrusted_model_test: {len(failures)} failed: {failures}")
print("untrusted_model_test: all passed")
