#!/usr/bin/env python3
"""Merges the per-rank Chrome traces of fsdp-train --profile-dir into one
timeline (each rank is already its own process id).
    scripts/merge_traces.py profile/trace_rank*.json --out profile/trace.json
"""
import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    events = []
    for path in a.traces:
        try:
            with open(path) as f:
                events += json.load(f)["traceEvents"]
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"merge_traces: {path}: not a Chrome trace ({e})")
    with open(a.out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    print(f"merge_traces: {len(a.traces)} traces, {len(events)} events -> {a.out}")


if __name__ == "__main__":
    main()
