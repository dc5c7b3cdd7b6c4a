#!/usr/bin/env python3
"""Turns text files into llm.c token shards with the byte tokenizer (token =
byte value, vocab 256): a header of 256 int32 (magic 20240520, version 1,
token count) followed by uint16 tokens. The last --val-fraction of the bytes
goes to val_*.bin, the rest to train_*.bin, --shard-tokens per shard.

    scripts/prepare_text.py /usr/share/common-licenses/* --out data/licenses
    build/examples/fsdp-train --data data/licenses/train_*.bin --val-data data/licenses/val_000000.bin ...
"""
import argparse
import os
import struct
import sys

MAGIC, VERSION = 20240520, 1


def write_shard(path, tokens):
    header = [0] * 256
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="text files")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--shard-tokens", type=int, default=100_000_000)
    a = p.parse_args()
    if not 0 <= a.val_fraction < 1:
        sys.exit(f"prepare_text: --val-fraction {a.val_fraction} is not in [0, 1)")
    if a.shard_tokens < 1:
        sys.exit(f"prepare_text: --shard-tokens {a.shard_tokens} must be >= 1")
    data = bytearray()
    for path in a.inputs:
        try:
            with open(path, "rb") as f:
                data += f.read()
        except OSError as e:
            sys.exit(f"prepare_text: cannot read {path}: {e.strerror}")
    if not data:
        sys.exit("prepare_text: the inputs are empty")
    os.makedirs(a.out, exist_ok=True)
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
