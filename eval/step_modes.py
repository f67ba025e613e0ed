#!/usr/bin/env python3
"""The Step modes section of eval/RESULTS.md, from `statepool-eval modes --tsv` tables.

Usage: step_modes.py --results eval/RESULTS.md --tokens N --offsets LIST MODEL=TSV...

Per model and case: the means over the windows of the perplexity change against FP32,
next-byte agreement, output TV, mean state error, and the fractions of head steps that
had a light fit and that fell back to the full fit. Then the acceptance rule of issue 47
per light setting (fit and N), over every model:
  stepquant6: perplexity change <= +0.05% on every model;
  stepquant4: perplexity change within 1.25x of the full-fit step's change, read as
              <= full + max(0.25 |full|, 0.05): where the full fit's change is below
              0.2% (all but the long-lived models here), 1.25x of it is within the
              windows' noise, so the +0.05% that stepquant6's rule calls negligible is
              the tolerance there.
The section replaces everything from its marker line to the end of the file, so eval/run
(which writes the rest) and this script can each be rerun alone.
"""

import argparse
import csv
import datetime
import os
import re
import sys
from collections import OrderedDict

MARKER = "<!-- step-modes: written by eval/step-modes; do not edit by hand -->"
COLUMNS = ("ppl_delta_pct", "agreement", "tv", "mean_state_error", "final_state_error",
           "light_fraction", "fallback_fraction")


def read_table(path):
    """{case: {column: mean over windows}}, cases in file order; and the window count."""
    sums = OrderedDict()
    windows = set()
    with open(path, newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            windows.add(row["window"])
            acc = sums.setdefault(row["case"], {c: [] for c in COLUMNS})
            for c in COLUMNS:
                acc[c].append(float(row[c]))
    means = OrderedDict()
    for case, acc in sums.items():
        means[case] = {c: sum(v) / len(v) for c, v in acc.items()}
    return means, len(windows)


def split_case(case):
    """('stepquant6', None) for the full fit; ('stepquant6', 'N=16 norefit')."""
    m = re.match(r"^(stepquant[46]) light (.*)$", case)
    if m:
        return m.group(1), m.group(2)
    return case, None


def passes(codec, delta, full_delta):
    if codec == "stepquant6":
        return delta <= 0.05
    return delta <= full_delta + max(0.25 * abs(full_delta), 0.05)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--offsets", required=True)
    ap.add_argument("tables", nargs="+", metavar="MODEL=TSV")
    args = ap.parse_args()

    models = OrderedDict()
    windows = 0
    for item in args.tables:
        name, _, path = item.partition("=")
        if not path:
            sys.exit(f"step_modes.py: '{item}' is not MODEL=TSV")
        models[name], windows = read_table(path)

    # settings[(codec, setting)][model] = (delta, passed)
    settings = OrderedDict()
    for model, cases in models.items():
        for case, m in cases.items():
            codec, setting = split_case(case)
            if setting is None:
                continue
            full = cases[codec]["ppl_delta_pct"]
            delta = m["ppl_delta_pct"]
            settings.setdefault((codec, setting), OrderedDict())[model] = (
                delta, passes(codec, delta, full), m["light_fraction"],
                m["fallback_fraction"], m["mean_state_error"] / max(
                    cases[codec]["mean_state_error"], 1e-12))

    out = [MARKER, "", "## Step modes (issue 47)", ""]
    out.append(f"Written by `eval/step-modes` on {datetime.date.today().isoformat()} "
               f"({os.cpu_count()} cores). Means of {windows} windows of {args.tokens} "
               f"teacher-forced bytes of each model's held-out text (starting at "
               f"{args.offsets.replace(',', ', ')}), plans calibrated as in eval/run; the "
               "fused step stores the state after every token. *stepquant6* / "
               "*stepquant4* = the full fit (with the refit) every step; *light N=n* = the "
               "full fit on the steps whose number is a multiple of n (inf: never, but "
               "for a fallback) and a light fit on the others: *norefit* = steps 1-3 of "
               "the fit (fresh row and column scales) without the refit; *absmax* = the "
               "page's column scales and fresh absmax row scales; *impact* = the page's "
               "column scales and fresh row-impact row scales (values past the top level "
               "clamp); *impact+clamp* = and the full fit for a head one of whose rows "
               "clamps more than 5% of its values; *grown* = the page's column scales "
               "grown by a bound on the step's update, so that nothing clamps, and absmax "
               "row scales. *light* / *fell back* = the fractions of head steps that had "
               "a light fit / whose light fit fell back to the full fit. Acceptance (issue "
               "47): stepquant6 at most +0.05% perplexity against FP32 on every model; "
               "stepquant4 within 1.25x of the full fit's change on every model, read as "
               "at most the full fit's change + max(0.25 x its size, 0.05%): below 0.2%, "
               "1.25x is within the windows' noise.")
    out.append("")
    out.append("### Acceptance per setting")
    out.append("")
    names = list(models)
    out.append("| codec | setting | " + " | ".join(names) + " | holds on every model |")
    out.append("|---|---|" + "---|" * len(names) + "---|")
    for (codec, setting), per_model in settings.items():
        cells = []
        for name in names:
            if name not in per_model:
                cells.append("")
                continue
            delta, ok, light, fell, ratio = per_model[name]
            cells.append(f"{delta:+.3f}% {'ok' if ok else 'no'}, state x{ratio:.2f}, "
                         f"{100 * light:.0f}% light")
        every = all(per_model[n][1] for n in names if n in per_model)
        out.append(f"| {codec} | {setting} | " + " | ".join(cells) +
                   f" | {'yes' if every else 'no'} |")
    out.append("")
    out.append("*state xR* = the mean state error over the full fit's.")
    out.append("")
    for codec in ("stepquant6", "stepquant4"):
        holding = [setting for (c, setting), per_model in settings.items()
                   if c == codec and all(per_model[n][1] for n in names if n in per_model)]
        out.append(f"Holding on every model, {codec}: " +
                   (", ".join(holding) if holding else "none") + ".")
    for model, cases in models.items():
        out.append("")
        out.append(f"### {model}")
        out.append("")
        out.append("| case | perplexity vs FP32 | agreement | output TV | mean state error | "
                   "state error at the end | light | fell back |")
        out.append("|---|--:|--:|--:|--:|--:|--:|--:|")
        for case, m in cases.items():
            out.append(f"| {case} | {m['ppl_delta_pct']:+.3f}% | {100 * m['agreement']:.2f}% | "
                       f"{m['tv']:.5f} | {m['mean_state_error']:.4f} | "
                       f"{m['final_state_error']:.4f} | {100 * m['light_fraction']:.1f}% | "
                       f"{100 * m['fallback_fraction']:.1f}% |")
    section = "\n".join(out) + "\n"

    with open(args.results) as f:
        text = f.read()
    at = text.find(MARKER)
    head = text if at < 0 else text[:at]
    tmp = args.results + ".tmp"
    with open(tmp, "w") as f:
        f.write(head.rstrip("\n") + "\n\n" + section)
    os.replace(tmp, args.results)


if __name__ == "__main__":
    main()
