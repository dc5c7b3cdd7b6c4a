#!/usr/bin/env python3
"""chatterbot-corpus (PyPI, BSD) -> preference pairs in TRL's conversational format, for
fsdp-train --preference (and TRL): each dialog's first question and answer becomes
{"prompt": [user], "chosen": [assistant: the corpus's answer], "rejected": [assistant: ...]},
where the rejected reply is

  --rejected shifted        the answer of another dialog (the one 7 further on, of a different text)
  --rejected replies.jsonl  the reply a model gave to the question ({"question", "reply"} lines,
                            scripts/dpo_demo.sh's base-model replies); a question the file does not
                            answer, or answers with the corpus's own answer, is left out

  scripts/corpus_pairs.py pairs.jsonl --rejected shifted [--holdout 16]
  scripts/corpus_pairs.py --questions N

--holdout N writes the last N pairs to PAIRS.heldout.jsonl instead (after a fixed shuffle, so the
held-out questions come from every topic). --questions N prints the questions, one JSON string a
line, and writes nothing: the first N questions, what the demo asks the base model.
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus_chats  # noqa: E402  (the corpus's folder, as scripts/corpus_chats.py finds it)


def first_exchanges(topics, language):
    import yaml
    out, seen = [], set()
    for topic in topics.split(","):
        path = os.path.join(corpus_chats.corpus_dir(), language, topic + ".yml")
        if not os.path.exists(path):
            sys.exit(f"corpus_pairs: no topic '{topic}' in {language} ({path})")
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        for conv in doc.get("conversations") or []:
            if isinstance(conv, list) and len(conv) >= 2:
                q, a = str(conv[0]).strip(), str(conv[1]).strip()
                if q and a and q not in seen:
                    seen.add(q)
                    out.append((q, a))
    random.Random(0).shuffle(out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--rejected", default="shifted")
    ap.add_argument("--holdout", type=int, default=0)
    ap.add_argument("--questions", type=int, default=0, metavar="N")
    ap.add_argument("--language", default="english")
    ap.add_argument("--topics", default="botprofile,greetings,conversations,ai,computers,science")
    a = ap.parse_args()
    qa = first_exchanges(a.topics, a.language)
    if a.questions:
        for q, _ in qa[:a.questions]:
            print(json.dumps(q, ensure_ascii=False))
        return
    if not a.out:
        ap.error("the output file is required")
    pairs = []
    if a.rejected == "shifted":
        for k, (q, ans) in enumerate(qa):
            j = (k + 7) % len(qa)
            while qa[j][1] == ans:
                j = (j + 1) % len(qa)
            pairs.append((q, ans, qa[j][1]))
    else:
        replies = {}
        with open(a.rejected, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    r = json.loads(line)
                    if not isinstance(r, dict) or not isinstance(r.get("question"), str) \
                            or not isinstance(r.get("reply"), str):
                        sys.exit(f"corpus_pairs: {a.rejected}:{n}: expected "
                                 '{"question": "...", "reply": "..."}')
                    replies[r["question"]] = r["reply"].strip()
        pairs = [(q, ans, replies[q]) for q, ans in qa
                 if replies.get(q) and replies[q] != ans]
    if len(pairs) <= a.holdout:
        sys.exit(f"corpus_pairs: {len(pairs)} pairs, not more than --holdout {a.holdout}")

    def write(path, rows):
        with open(path, "w", encoding="utf-8") as f:
            for q, good, bad in rows:
                f.write(json.dumps({"prompt": [{"role": "user", "content": q}],
                                    "chosen": [{"role": "assistant", "content": good}],
                                    "rejected": [{"role": "assistant", "content": bad}]},
                                   ensure_ascii=False) + "\n")
    train = pairs[:len(pairs) - a.holdout]
    write(a.out, train)
    if a.holdout:
        write(a.out + ".heldout.jsonl", pairs[len(train):])
    print(f"corpus_pairs: {len(train)} pairs -> {a.out}"
          + (f", {a.holdout} held out -> {a.out}.heldout.jsonl" if a.holdout else ""))


if __name__ == "__main__":
    main()
