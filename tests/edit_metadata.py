#!/usr/bin/env python3
"""Edits a checkpoint folder's metadata.json as a forger would, for the tests:

    edit_metadata.py STEP_DIR PYTHON [reseal]

PYTHON runs with m (metadata.json's JSON, written back after it) and d (the folder); with
"reseal", complete.json is rewritten with the edited file's checksum (FNV-1a 64, as the seal), so
that only the checks behind the seal can refuse it."""
import json, os, sys  # noqa: F401 (os and sys are there for PYTHON)

d, code = sys.argv[1], sys.argv[2]
reseal = len(sys.argv) > 3 and sys.argv[3] == "reseal"
m = json.load(open(f"{d}/metadata.json"))
exec(code)
text = json.dumps(m, indent=1) + "\n"
open(f"{d}/metadata.json", "w").write(text)
if reseal:
    h = 0xcbf29ce484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001b3) % (1 << 64)
    c = json.load(open(f"{d}/complete.json"))
    c["metadata_checksum"] = f"{h:016x}"
    open(f"{d}/complete.json", "w").write(json.dumps(c))
