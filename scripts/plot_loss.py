#!/usr/bin/env python3
"""Draws the loss curves (train, and val where present) from fsdp-train's
--log-file JSON lines, or from its --tensorboard folder (or one event file),
into a PNG: with matplotlib (Debian: python3-matplotlib), else gnuplot
(Debian: gnuplot-nox), else a plain chart drawn here (axes, the curves, and the
ranges of step and loss written in a small bitmap font), so that a PNG is
always written.

    scripts/plot_loss.py run.jsonl [more.jsonl | tb_dir ...] --out loss.png
"""
import argparse
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib


def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def fields(b):
    """(field, wire type, value) of one protobuf message: ints for varints, bytes otherwise."""
    i = 0
    while i < len(b):
        k, i = varint(b, i)
        f, t = k >> 3, k & 7
        if t == 0:
            v, i = varint(b, i)
        elif t == 1:
            v, i = b[i:i + 8], i + 8
        elif t == 5:
            v, i = b[i:i + 4], i + 4
        elif t == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError(f"wire type {t}")
        yield f, t, v


def read_events(path):
    """The loss and val_loss scalars of TensorBoard event files (a folder of them, or one)."""
    files = sorted(glob.glob(os.path.join(path, "events.out.tfevents.*"))) if os.path.isdir(path) else [path]
    if not files:
        sys.exit(f"plot_loss: {path}: no events.out.tfevents.* file")
    series = {"loss": {}, "val_loss": {}}
    for fn in files:
        data = open(fn, "rb").read()
        at = 0
        while at + 12 <= len(data):
            (n,) = struct.unpack_from("<Q", data, at)
            rec = data[at + 12:at + 12 + n]
            at += 12 + n + 4
            if len(rec) < n:
                break  # a record still being written
            step, values = 0, []
            for f, _, v in fields(rec):
                if f == 2:
                    step = v
                elif f == 5:
                    for g, _, val in fields(v):
                        if g == 1:
                            d = {h: x for h, _, x in fields(val)}
                            if 1 in d and 2 in d:
                                values.append((d[1].decode(), struct.unpack("<f", d[2])[0]))
            for tag, x in values:
                if tag in series:
                    series[tag][step] = x
    return sorted(series["loss"].items()), sorted(series["val_loss"].items())


# A 3x5 bitmap font for the axis ranges: each glyph is 5 rows of 3 bits.
FONT = {"0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
        "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
        "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
        "e": "000111111100111", "+": "000010111010000", " ": "000000000000000"}


def draw_png(series, out, width=960, height=600):
    """A line chart without matplotlib or gnuplot: white ground, axes, one colour per series."""
    px = bytearray(b"\xff" * (width * height * 3))

    def dot(x, y, c):
        if 0 <= x < width and 0 <= y < height:
            px[3 * (y * width + x):3 * (y * width + x) + 3] = bytes(c)

    def line(x0, y0, x1, y1, c):
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for k in range(n + 1):
            dot(round(x0 + (x1 - x0) * k / n), round(y0 + (y1 - y0) * k / n), c)

    def text(x, y, s, scale=3):
        for ch in s:
            g = FONT.get(ch, FONT[" "])
            for r in range(5):
                for col in range(3):
                    if g[3 * r + col] == "1":
                        for a in range(scale):
                            for b in range(scale):
                                dot(x + col * scale + a, y + r * scale + b, (0, 0, 0))
            x += 4 * scale

    pts = [p for _, s in series for p in s]
    if not pts:
        sys.exit("plot_loss: no points to draw")
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    left, right, top, bottom = 90, width - 30, 30, height - 60
    sx = lambda s: round(left + (s - x0) / (x1 - x0) * (right - left))
    sy = lambda v: round(bottom - (v - y0) / (y1 - y0) * (bottom - top))
    line(left, bottom, right, bottom, (0, 0, 0))
    line(left, top, left, bottom, (0, 0, 0))
    text(5, top, f"{y1:.3g}")
    text(5, bottom - 15, f"{y0:.3g}")
    text(left, bottom + 15, f"{x0}")
    text(right - 4 * 3 * len(str(x1)), bottom + 15, f"{x1}")
    colours = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189)]
    for i, (label, s) in enumerate(series):
        c = colours[i % len(colours)]
        for (a, b), (d, e) in zip(s, s[1:]):
            line(sx(a), sy(b), sx(d), sy(e), c)
        if "val" in label:
            for a, b in s:
                for u in range(-3, 4):
                    line(sx(a) - 3, sy(b) + u, sx(a) + 3, sy(b) + u, c)
    raw = b"".join(b"\x00" + bytes(px[3 * y * width:3 * (y + 1) * width]) for y in range(height))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    with open(out, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def read(path):
    if os.path.isdir(path) or os.path.basename(path).startswith("events.out.tfevents."):
        return read_events(path)
    train, val = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                j = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_loss: {path}:{n}: not JSON: {e}")
            train.append((j["step"], j["loss"]))
            if "val_loss" in j:
                val.append((j["step"], j["val_loss"]))
    return train, val


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+")
    p.add_argument("--out", default="loss.png")
    a = p.parse_args()
    series = []
    for path in a.logs:
        train, val = read(path)
        name = os.path.basename(os.path.normpath(path))
        series.append((f"{name} train", train))
        if val:
            series.append((f"{name} val", val))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5))
        for label, pts in series:
            ax.plot([s for s, _ in pts], [l for _, l in pts], label=label, marker="o" if "val" in label else None)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.savefig(a.out, dpi=120, bbox_inches="tight")
    except ImportError:
        with tempfile.TemporaryDirectory() as d:
            plots = []
            for i, (label, pts) in enumerate(series):
                fn = os.path.join(d, f"{i}.dat")
                with open(fn, "w") as f:
                    f.writelines(f"{s} {l}\n" for s, l in pts)
                plots.append(f"'{fn}' using 1:2 with {'linespoints' if 'val' in label else 'lines'} title '{label}'")
            script = (f"set terminal png size 960,600\nset output '{a.out}'\nset xlabel 'step'\nset ylabel 'loss'\n"
                      f"set grid\nplot {', '.join(plots)}\n")
            try:
                subprocess.run(["gnuplot"], input=script.encode(), check=True)
            except FileNotFoundError:  # neither: the plain chart
                draw_png(series, a.out)
    print(f"plot_loss: wrote {a.out}")


if __name__ == "__main__":
    main()
