#!/usr/bin/env python3
"""Draws the relative state error against time from `statepool-eval run --csv` files.

    /usr/bin/python3 eval/plot.py --out eval/state-error.png GDN=gdn.csv KDA=kda.csv

One panel per model (TITLE=FILE), two to a row, log-log axes, one line per codec: the error after
each token, smoothed by a trailing mean over the last t/10 tokens (the raw values swing
with the text). The STEPQuant ablations are drawn thin and dashed. Needs matplotlib
(Debian: python3-matplotlib).
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

CEILING = 10.0  # the y axis stops here: an error of 10x the state is a diverged run
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


def smoothed(values: list[float]) -> list[float]:
    """Trailing mean over the last max(1, t // 10) values at each t (1-based)."""
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    out = []
    for t in range(1, len(values) + 1):
        w = max(1, t // 10)
        out.append((prefix[t] - prefix[t - w]) / w)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("panels", nargs="+", metavar="TITLE=FILE")
    args = p.parse_args()
    columns = min(2, len(args.panels))
    rows = (len(args.panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(7 * columns, 5.2 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, args.panels):
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
            ax.plot(t, [max(v, 1e-9) for v in smoothed(values)], label=name,
                    color=COLOURS.get(base, "black"), linewidth=0.8 if ablation else 1.6,
                    linestyle="--" if ablation else "-", alpha=0.7 if ablation else 1.0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        if ax.get_ylim()[1] > CEILING:  # a codec whose state diverged: keep the rest readable
            ax.set_ylim(top=CEILING)
            ax.text(0.02, 0.97, f"lines that leave the top diverged (error > {CEILING:g})",
                    transform=ax.transAxes, fontsize=8, va="top")
        ax.set_xlabel("decode step t (tokens)")
        ax.set_ylabel("relative state error ||S - S_fp32|| / ||S_fp32||")
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=8, fontsize=8, frameon=False)
    fig.suptitle("State re-encoded every token: error against the FP32-state run "
                 "(trailing mean over t/10 tokens)")
    for ax in list(axes.flat)[len(args.panels):]:
        ax.set_visible(False)
    fig.tight_layout(rect=(0, 0.08 / rows, 1, 1))
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
