#!/usr/bin/env python3
"""Draws a Chrome trace from fsdp-train --profile-dir as a PNG timeline, one
lane per (rank, thread): ops blue, FSDP annotations grey, collectives orange,
waits red. Standard library only (zlib PNG), so it runs anywhere.
    scripts/plot_trace.py profile/trace_rank0.json profile/trace_rank1.json --out docs/trace.png
"""
import argparse
import json
import struct
import zlib

COLORS = {"op": (66, 133, 244), "annotation": (170, 170, 170), "collective": (245, 145, 30), "wait": (220, 50, 50)}
FONT = {}  # no text rendering: lanes are labelled in the accompanying markdown


def png(path, w, h, px):
    raw = b"".join(b"\x00" + bytes(px[y * w * 3:(y + 1) * w * 3]) for y in range(h))
    def chunk(t, d):
        c = struct.pack(">I", len(d)) + t + d
        return c + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("traces", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--width", type=int, default=1600)
    a = p.parse_args()
    lanes, names, spans = {}, {}, []
    for path in a.traces:
        for e in json.load(open(path))["traceEvents"]:
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                names[(e["pid"], e["tid"])] = e["args"]["name"]
            if e.get("ph") != "X":
                continue
            kind = "op"
            if e["name"] == "FSDP::wait":
                kind = "wait"
            elif e["cat"] == "user_annotation":
                kind = "annotation"
            elif ":" in e["name"]:
                kind = "collective"
            key = (e["pid"], e["tid"])
            lanes.setdefault(key, len(lanes))
            spans.append((key, e["ts"], e["ts"] + e["dur"], kind))
    t0 = min(s[1] for s in spans)
    t1 = max(s[2] for s in spans)
    # Per rank: the compute thread first, then its communication threads.
    order = sorted(lanes, key=lambda k: (k[0], names.get(k, "") != "main", names.get(k, "")))
    lane_h, gap = 28, 8
    h = len(order) * (lane_h + gap) + gap
    w = a.width
    px = bytearray([255] * (w * h * 3))
    for key, b, e, kind in sorted(spans, key=lambda s: s[3] != "annotation"):  # annotations underneath
        i = order.index(key)
        y0 = gap + i * (lane_h + gap) + (8 if kind == "annotation" else 0)
        y1 = y0 + (lane_h - (8 if kind == "annotation" else 0))
        x0 = int((b - t0) / (t1 - t0) * (w - 1))
        x1 = max(x0 + 1, int((e - t0) / (t1 - t0) * (w - 1)))
        c = COLORS[kind]
        for y in range(y0, y1):
            row = y * w * 3
            for x in range(x0, x1):
                px[row + 3 * x:row + 3 * x + 3] = bytes(c)
    png(a.out, w, h, px)
    print(f"plot_trace: {a.out}: {(t1 - t0) / 1e3:.1f} ms; lanes top to bottom:")
    for key in order:
        print(f"  rank {key[0]} / {names.get(key, key[1])}")


if __name__ == "__main__":
    main()
