#!/usr/bin/env python3
"""Draws the loss curves (train, and val where present) from fsdp-train's
--log-file JSON lines into a PNG, with matplotlib (Debian: python3-matplotlib)
or, failing that, gnuplot (Debian: gnuplot-nox).

    scripts/plot_loss.py run.jsonl [more.jsonl ...] --out loss.png
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def read(path):
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
        name = os.path.basename(path)
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
            except FileNotFoundError:
                sys.exit("plot_loss: needs matplotlib (python3-matplotlib) or gnuplot (gnuplot-nox)")
    print(f"plot_loss: wrote {a.out}")


if __name__ == "__main__":
    main()
