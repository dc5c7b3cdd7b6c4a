#!/usr/bin/env python3
"""Chat JSONL -> tokenized rows with a loss mask, rendered by transformers' own apply_chat_template
for any model's template: the reference that fsdp-train's own rendering (the model's template in
its Jinja engine, the same targets) is tested against, and a way to train what that refuses.

  scripts/chat_rows.py --model HF_FOLDER chats.jsonl rows.jsonl
  fsdp-train --init-from MODEL --data rows.jsonl ...

Each input line is {"messages": [{"role": ..., "content": ...}, ...]}; each output line is
{"input_ids": [...], "labels": [...]}, a label -100 where the token is not trained on, else the id.
The targets are each assistant turn's reply and its end-of-turn marker: the text that rendering
the turn adds after the generation prompt (the header "<|im_start|>assistant\\n", say), less the
whitespace after the marker. A token is a target when any of its characters is (as transformers'
return_assistant_tokens_mask marks them). A template whose rendering of a prefix of the conversation
is not a prefix of the whole (one that rewrites earlier turns) is refused, naming the line.
Needs transformers and jinja2 (scripts/install-deps.sh installs both)."""
import argparse
import json
import os
import sys


def spans(tok, messages):
    """The character spans of the assistant turns in the rendered text, and the text."""
    def render(ms, gen):
        return tok.apply_chat_template(ms, tokenize=False, add_generation_prompt=gen)
    text = render(messages, False)
    out = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head, whole = render(messages[:i], True), render(messages[:i + 1], False)
        if not text.startswith(whole) or not whole.startswith(head):
            raise ValueError(f"message {i}: the template does not render the conversation's turns as "
                             "prefixes of one another; its targets cannot be found by rendering")
        out.append((len(head), len(whole.rstrip())))
    return text, out


def row(tok, messages):
    text, targets = spans(tok, messages)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = []
    for tid, (b, e) in zip(enc["input_ids"], enc["offset_mapping"]):
        hit = any(b < te and e > tb for tb, te in targets)
        labels.append(tid if hit else -100)
    return {"input_ids": enc["input_ids"], "labels": labels}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True,
                    help="a Hugging Face folder: tokenizer.json and tokenizer_config.json (with its "
                         "chat_template) or chat_template.jinja")
    ap.add_argument("input")
    ap.add_argument("output")
    a = ap.parse_args()
    try:
        from transformers import AutoTokenizer
    except ImportError:
        sys.exit("chat_rows: transformers is missing; run scripts/install-deps.sh")
    tok = AutoTokenizer.from_pretrained(a.model)
    if not tok.chat_template:
        sys.exit(f"chat_rows: {a.model} has no chat template")
    n = 0
    with open(a.input, encoding="utf-8") as f, open(a.output + ".tmp", "w") as out:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                messages = json.loads(line)["messages"]
                out.write(json.dumps(row(tok, messages)) + "\n")
            except (ValueError, KeyError, TypeError) as e:
                sys.exit(f"chat_rows: {a.input}:{line_no}: {e}")
            n += 1
    os.replace(a.output + ".tmp", a.output)
    print(f"chat_rows: {n} conversations from {a.input} -> {a.output}")


if __name__ == "__main__":
    main()
