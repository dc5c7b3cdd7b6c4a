#!/usr/bin/env python3
"""chatterbot-corpus (PyPI, BSD) -> chat JSONL for fsdp-train --data: each YAML conversation (a
list of utterances, the user's first, then the bot's, alternating) becomes one
{"messages": [{"role": "user", ...}, {"role": "assistant", ...}, ...]} line; a conversation that
ends on the user is cut before that last utterance, so that each ends on a reply.

  scripts/corpus_chats.py out.jsonl                          # English: botprofile, greetings, conversations
  scripts/corpus_chats.py out.jsonl --topics trivia,ai --language english
  scripts/corpus_chats.py --list                             # the topics of each language

It also writes OUT.questions.jsonl: the question of each one-question conversation whose answer is
the only one the corpus gives it, with that answer (scripts/finetune.sh asks them before and
after)."""
import argparse
import importlib.util
import json
import os
import sys


def corpus_dir():
    spec = importlib.util.find_spec("chatterbot_corpus")
    if spec is None:
        sys.exit("corpus_chats: chatterbot-corpus is not installed; run scripts/install-deps.sh")
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--language", default="english")
    ap.add_argument("--topics", default="botprofile,greetings,conversations")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    try:
        import yaml
    except ImportError:
        sys.exit("corpus_chats: PyYAML is missing (transformers brings it: scripts/install-deps.sh)")
    root = corpus_dir()
    if a.list:
        for lang in sorted(os.listdir(root)):
            print(lang, ", ".join(sorted(f[:-4] for f in os.listdir(os.path.join(root, lang)) if f.endswith(".yml"))))
        return
    if not a.out:
        ap.error("the output file is required")
    chats, answers = [], {}
    for topic in a.topics.split(","):
        path = os.path.join(root, a.language, topic + ".yml")
        if not os.path.exists(path):
            sys.exit(f"corpus_chats: no topic '{topic}' in {a.language} ({path}); --list shows them")
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        for k, conv in enumerate(doc.get("conversations") or []):
            if not isinstance(conv, list) or not all(isinstance(u, (str, int, float)) for u in conv):
                sys.exit(f"corpus_chats: {path}: conversation {k} is not a list of utterances")
            turns = [str(u).strip() for u in conv]
            turns = turns[:len(turns) // 2 * 2]  # ends on a reply
            if not turns:
                continue
            chats.append({"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                                       for i, t in enumerate(turns)]})
            if len(turns) == 2:
                answers.setdefault(turns[0], (topic, set()))[1].add(turns[1])
    questions = [{"question": q, "answer": next(iter(a)), "topic": t}
                 for q, (t, a) in answers.items() if len(a) == 1]
    with open(a.out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(c, ensure_ascii=False) + "\n" for c in chats)
    with open(a.out + ".questions.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(q, ensure_ascii=False) + "\n" for q in questions)
    print(f"corpus_chats: {len(chats)} conversations ({sum(len(c['messages']) for c in chats)} turns) "
          f"from {a.language}/{{{a.topics}}} -> {a.out}")


if __name__ == "__main__":
    main()
