#!/usr/bin/env python3
"""Turns text files into llm.c token shards: a header of 256 int32 (magic,
version, token count) followed by the tokens, little-endian, as llm.c writes
them: magic 20240520, version 1 and uint16 tokens when every id fits (a
vocabulary of at most 65536 ids, GPT-2's or SmolLM2's), else magic 20240801,
version 7 and uint32 tokens (llm.c's Llama 3 shards; Llama 3 has 128256 ids).
The last --val-fraction of the tokens goes to val_*.bin, the rest to
train_*.bin, --shard-tokens per shard. fsdp-train memory-maps the shards.

--tokenizer bytes (the default): token = byte value, vocab 256.
--tokenizer bpe --vocab-size N: trains a byte-level BPE tokenizer on the
inputs with Hugging Face tokenizers (GPT-2's pre-tokenizer, no prefix space,
"<|endoftext|>" as id 0 between files), writes it to OUT/tokenizer.json and
encodes with it.
--tokenizer PATH (a model's tokenizer.json, or a folder holding one): encodes
with that Hugging Face tokenizer (its own special tokens, e.g. Llama 3's
<|begin_of_text|>, are added as it adds them) and copies it to
OUT/tokenizer.json; each file ends with the end-of-text token
(tokenizer_config.json's eos_token beside it, else the first of
<|endoftext|>, <|end_of_text|>, </s>, <|im_end|>, <eos> in the vocabulary).
fsdp-train finds OUT/tokenizer.json beside the shards, records it in its
checkpoints, and fsdp-export and fsdp-generate use it.

    scripts/prepare_text.py /usr/share/common-licenses/* --out data/licenses
    scripts/prepare_text.py /usr/share/common-licenses/* --out data/bpe --tokenizer bpe --vocab-size 4096
    scripts/prepare_text.py corpus/*.txt --out data/smol --tokenizer models/SmolLM2-135M/tokenizer.json
    build/examples/fsdp-train --data data/licenses/train_*.bin --val-data data/licenses/val_000000.bin ...
"""
import argparse
import array
import json
import os
import shutil
import struct
import sys

# (magic, version, array type code) by token width, as llm.c's dev/data/data_common.py has them.
HEADERS = {16: (20240520, 1, "H"), 32: (20240801, 7, "I")}
EOT = "<|endoftext|>"
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>", "<eos>")


def write_shard(path, tokens, bits):
    magic, version, code = HEADERS[bits]
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens)
    body = array.array(code, tokens)
    assert body.itemsize == bits // 8
    if sys.byteorder != "little":
        body.byteswap()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(body.tobytes())
    os.replace(tmp, path)


def load_tokenizer(path, out):
    """A model's Hugging Face tokenizer.json (or a folder holding one), copied to OUT."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("prepare_text: --tokenizer PATH needs Hugging Face tokenizers "
                 "(python3 -m pip install tokenizers; scripts/install-deps.sh installs it)")
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        sys.exit(f"prepare_text: --tokenizer {path}: no such file (expected bytes, bpe, "
                 "a tokenizer.json or a folder holding one)")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # the tokenizers package raises its own exception types
        sys.exit(f"prepare_text: --tokenizer {path} is not a Hugging Face tokenizer.json: {e}")
    dest = os.path.join(out, "tokenizer.json")
    if not (os.path.exists(dest) and os.path.samefile(path, dest)):
        shutil.copyfile(path, dest + ".tmp")
        os.replace(dest + ".tmp", dest)
    eos = None
    config = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    if os.path.isfile(config):
        with open(config) as f:
            name = json.load(f).get("eos_token")
        if isinstance(name, dict):
            name = name.get("content")
        if isinstance(name, str):
            eos = tok.token_to_id(name)
    for name in EOS_NAMES:
        if eos is None:
            eos = tok.token_to_id(name)
    if eos is None:
        print(f"prepare_text: {path} has no end-of-text token ({', '.join(EOS_NAMES)}); "
              "files are joined without one", file=sys.stderr)
    print(f"prepare_text: tokenizer {path} ({tok.get_vocab_size()} ids), copied to {dest}")
    return tok, eos


def train_bpe(paths, vocab_size, out):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        sys.exit("prepare_text: --tokenizer bpe needs Hugging Face tokenizers "
                 "(python3 -m pip install tokenizers; scripts/install-deps.sh installs it)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(paths, trainer)
    path = os.path.join(out, "tokenizer.json")
    tok.save(path + ".tmp")
    os.replace(path + ".tmp", path)
    print(f"prepare_text: wrote {path} ({tok.get_vocab_size()} ids)")
    return tok


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="text files")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--shard-tokens", type=int, default=100_000_000)
    p.add_argument("--tokenizer", default="bytes",
                   help="bytes (token = byte), bpe (trained here), or a model's tokenizer.json")
    p.add_argument("--vocab-size", type=int, default=4096, help="ids of the BPE tokenizer")
    a = p.parse_args()
    if not 0 <= a.val_fraction < 1:
        sys.exit(f"prepare_text: --val-fraction {a.val_fraction} is not in [0, 1)")
    if a.shard_tokens < 1:
        sys.exit(f"prepare_text: --shard-tokens {a.shard_tokens} must be >= 1")
    if a.shard_tokens > 2**31 - 1:
        sys.exit(f"prepare_text: --shard-tokens {a.shard_tokens} must be < 2^31 (the header's int32 count)")
    if a.tokenizer == "bpe" and a.vocab_size < 257 + 1:
        sys.exit(f"prepare_text: --vocab-size {a.vocab_size} must be >= 258 "
                 "(257 ids for the bytes and <|endoftext|>)")
    texts = []
    for path in a.inputs:
        try:
            with open(path, "rb") as f:
                texts.append(f.read())
        except OSError as e:
            sys.exit(f"prepare_text: cannot read {path}: {e.strerror}")
    if not any(texts):
        sys.exit("prepare_text: the inputs are empty")
    os.makedirs(a.out, exist_ok=True)
    if a.tokenizer == "bytes":
        data = [b for t in texts for b in t]
        vocab = 256
    else:
        if a.tokenizer == "bpe":
            tok = train_bpe(a.inputs, a.vocab_size, a.out)
            eot = tok.token_to_id(EOT)
        else:
            tok, eot = load_tokenizer(a.tokenizer, a.out)
        vocab = tok.get_vocab_size()
        data = []
        for t in texts:  # one document per file, each followed by the end-of-text token
            data += tok.encode(t.decode("utf-8", errors="replace")).ids + ([eot] if eot is not None else [])
        vocab = max(vocab, max(data, default=0) + 1)
    bits = 16 if vocab <= 65536 else 32
    cut = len(data) - int(len(data) * a.val_fraction)
    for split, chunk in (("train", data[:cut]), ("val", data[cut:])):
        for i in range(0, max(len(chunk), 1), a.shard_tokens):
            part = list(chunk[i:i + a.shard_tokens])
            if not part:
                continue
            path = os.path.join(a.out, f"{split}_{i // a.shard_tokens:06d}.bin")
            write_shard(path, part, bits)
            print(f"prepare_text: wrote {path} ({len(part)} tokens, uint{bits})")


if __name__ == "__main__":
    main()
