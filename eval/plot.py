#!/usr/bin/env python3
"""Draws the relative state error against time from `statepool-eval run --csv` files.

    /usr/bin/python3 eval/plot.py --out eval/state-error.png GDN=gdn.csv KDA=kda.csv

One panel per model (TITLE=FILE), log-log axes, one line per codec; the STEPQuant
ablations are drawn thin and dashed. Needs matplotlib (Debian: python3-matplotlib).
"""

from __future__ import annotations

import argparse
import csv
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot.py: matplotlib is missing: apt-get install python3-matplotlib")

MAIN = ["bf16", "fp16", "int8", "int6", "int4", "dsq6", "dsq4", "stepquant6", "stepquant4"]
COLOURS = {"bf16": "#999999", "fp16": "#555555", "int8": "#1f77b4", "int6": "#ff7f0e",
           "int4": "#d62728", "dsq6": "#bcbd22", "dsq4": "#8c564b", "stepquant6": "#2ca02c",
           "stepquant4": "#9467bd"}


def read(path: str) -> dict[str, list[float]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0][0] != "t":
        sys.exit(f"plot.py: {path} is not a statepool-eval --csv file")
    columns = {name: [] for name in rows[0]}
    for row in rows[1:]:
        for name, value in zip(rows[0], row):
            columns[name].append(float(value))
    return columns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("panels", nargs="+", metavar="TITLE=FILE")
    args = p.parse_args()
    fig, axes = plt.subplots(1, len(args.panels), figsize=(7 * len(args.panels), 5.2),
                             squeeze=False)
    for ax, panel in zip(axes[0], args.panels):
        title, _, path = panel.partition("=")
        if not path:
            sys.exit(f"plot.py: expected TITLE=FILE, got {panel!r}")
        data = read(path)
        t = data.pop("t")
        for name, values in data.items():
            if name == "fp32" or max(values) == 0:
                continue  # zero error: nothing to draw on a log axis
            base = name.split("-")[0]
            ablation = name not in MAIN
            ax.plot(t, [max(v, 1e-9) for v in values], label=name,
                    color=COLOURS.get(base, "black"), linewidth=0.8 if ablation else 1.6,
                    linestyle="--" if ablation else "-", alpha=0.7 if ablation else 1.0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("decode step t (tokens)")
        ax.set_ylabel("relative state error ||S - S_fp32|| / ||S_fp32||")
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.suptitle("State re-encoded every token: error against the FP32-state run")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
