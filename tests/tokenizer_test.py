#!/usr/bin/env python3
"""The library's tokenizer against Hugging Face tokenizers (PyPI), which trained it:
scripts/prepare_text.py --tokenizer bpe trains a byte-level BPE on this repository's
text, then fsdp-tokenize must give the ids Hugging Face gives, on the corpus and on
random strings drawn from every kind of character GPT-2's split tells apart (letters,
numbers, marks, punctuation and spaces of many scripts, emoji, "<|endoftext|>",
contractions), and decode them back to the same text. The byte vocabulary must be
the bytes. usage: tokenizer_test.py FSDP_TOKENIZE PREPARE_TEXT REPO"""
import glob
import os
import random
import subprocess
import sys
import tempfile

try:
    from tokenizers import Tokenizer
except ImportError:
    sys.exit("tokenizer_test: Hugging Face tokenizers is missing; run scripts/install-deps.sh")

tool, prepare, repo = sys.argv[1:4]
fails = []


def run(args):
    r = subprocess.run([tool, *args], capture_output=True)
    if r.returncode != 0:
        sys.exit(f"fsdp-tokenize {' '.join(args[:3])} failed: {r.stderr.decode()}")
    return r.stdout.decode()


def ours(tok, texts, work):
    """Our ids for each text, and our decoding of them: two runs of fsdp-tokenize."""
    paths = []
    for i, t in enumerate(texts):
        paths.append(os.path.join(work, f"s{i}"))
        with open(paths[-1], "wb") as f:
            f.write(t.encode("utf-8", errors="surrogateescape"))
    ids = [[int(x) for x in line.split()] for line in run(["--tokenizer", tok, *paths]).split("\n")[:len(texts)]]
    for p, i in zip(paths, ids):
        with open(p + ".ids", "w") as f:
            f.write(" ".join(map(str, i)))
    run(["--tokenizer", tok, "--decode", *[p + ".ids" for p in paths]])
    back = [open(p + ".ids.txt", "rb").read().decode("utf-8", errors="surrogateescape") for p in paths]
    return ids, back


with tempfile.TemporaryDirectory() as work:
    corpus = sorted(glob.glob(os.path.join(repo, "*.md")) + glob.glob(os.path.join(repo, "docs", "*.md")))
    subprocess.run([sys.executable, prepare, *corpus, "--out", work, "--tokenizer", "bpe",
                    "--vocab-size", "1024"], check=True, capture_output=True)
    tj = os.path.join(work, "tokenizer.json")
    hf = Tokenizer.from_file(tj)

    rng = random.Random(7)
    palette = (list("abcXYZ019 '\t\n\r.,;!?-_()[]{}\"'") + ["'s", "'ll", "'re", "'d", "'T", " '", "  ", "\n\n  "]
               + list("éüßñçØåÆœ") + ["e\u0301", "\u0300", "\u20ac", "\u00a0", "\u2003", "\u3000", "\u2028"]
               + list("—–“”‘’…•") + list("½²³٣४") + list("日本語中文한국어カタカナ") + list("Ελληνικάкириллица")
               + list("عربيעברית") + ["🙂", "👍🏽", "\U0001F600"] + ["<|endoftext|>", "\x00", "\x7f", "\u200b"])
    samples = [open(corpus[0], encoding="utf-8").read()[:20000]]
    for _ in range(300):
        samples.append("".join(rng.choice(palette) for _ in range(rng.randint(0, 40))))
    got, back = ours(tj, samples, work)
    for i, text in enumerate(samples):
        want = hf.encode(text).ids
        if want != got[i]:
            fails.append(f"sample {i} {text[:60]!r}: Hugging Face {want[:20]} ours {got[i][:20]}")
        elif back[i] != text:
            fails.append(f"sample {i} {text[:60]!r}: decode does not give the text back")
    text = "bytes: \x00\xff é\n"
    if ours("bytes", [text], work)[0][0] != list(text.encode()):
        fails.append("the byte tokenizer is not the bytes")

print(f"tokenizer_test: {len(samples)} samples against Hugging Face tokenizers")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
