#!/usr/bin/env python3
"""Turns text files into llm.c token shards: a header of 256 int32 (magic
20240520, version 1, token count) followed by uint16 tokens. The last
--val-fraction of the tokens goes to val_*.bin, the rest to train_*.bin,
--shard-tokens per shard.

--tokenizer bytes (the default): token = byte value, vocab 256.
--tokenizer bpe --vocab-size N: trains a byte-level BPE tokenizer on the
inputs with Hugging Face tokenizers (GPT-2's pre-tokenizer, no prefix space,
"<|endoftext|>" as id 0 between files), writes it to OUT/tokenizer.json and
encodes with it. fsdp-train finds OUT/tokenizer.json beside the shards,
records it in its checkpoints, and fsdp-export and fsdp-generate use it.

    scripts/prepare_text.py /usr/share/common-licenses/* --out data/licenses
    scripts/prepare_text.py /usr/share/common-licenses/* --out data/bpe --tokenizer bpe --vocab-size 4096
    build/examples/fsdp-train --data data/licenses/train_*.bin --val-data data/licenses/val_000000.bin ...
"""
import argparse
import os
import struct
import sys

MAGIC, VERSION = 20240520, 1
EOT = "<|endoftext|>"


def write_shard(path, tokens):
    header = [0] * 256
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    os.replace(tmp, path)


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
    p.add_argument("--tokenizer", default="bytes", help="bytes (token = byte) or bpe (trained here)")
    p.add_argument("--vocab-size", type=int, default=4096, help="ids of the BPE tokenizer")
    a = p.parse_args()
    if not 0 <= a.val_fraction < 1:
        sys.exit(f"prepare_text: --val-fraction {a.val_fraction} is not in [0, 1)")
    if a.shard_tokens < 1:
        sys.exit(f"prepare_text: --shard-tokens {a.shard_tokens} must be >= 1")
    if a.tokenizer not in ("bytes", "bpe"):
        sys.exit(f"prepare_text: --tokenizer must be bytes or bpe, got '{a.tokenizer}'")
    if a.tokenizer == "bpe" and not 257 + 1 <= a.vocab_size <= 65536:
        sys.exit(f"prepare_text: --vocab-size {a.vocab_size} must be in [258, 65536] "
                 "(257 ids for the bytes and <|endoftext|>, uint16 tokens)")
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
    else:
        tok = train_bpe(a.inputs, a.vocab_size, a.out)
        eot = tok.token_to_id(EOT)
        data = []
        for t in texts:  # one document per file, each followed by <|endoftext|>
            data += tok.encode(t.decode("utf-8", errors="replace")).ids + [eot]
    cut = len(data) - int(len(data) * a.val_fraction)
    for split, chunk in (("train", data[:cut]), ("val", data[cut:])):
        for i in range(0, max(len(chunk), 1), a.shard_tokens):
            part = list(chunk[i:i + a.shard_tokens])
            if not part:
                continue
            path = os.path.join(a.out, f"{split}_{i // a.shard_tokens:06d}.bin")
            write_shard(path, part)
            print(f"prepare_text: wrote {path} ({len(part)} tokens)")


if __name__ == "__main__":
    main()
