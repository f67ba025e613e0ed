#!/usr/bin/env python3
"""eval/step_modes.py: window means, the acceptance rule and the RESULTS.md section it
rewrites (run by ctest as eval.step_modes_report, with Debian's interpreter)."""

import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "eval",
                      "step_modes.py")
HEADER = ("window\tcase\tppl_delta_pct\tagreement\ttv\tmean_state_error\tfinal_state_error\t"
          "light_fraction\tfallback_fraction\n")


def row(window, case, delta, state=0.1, light=0.0):
    return f"{window}\t{case}\t{delta:+.4f}\t0.99\t0.001\t{state}\t{state}\t{light}\t0\n"


class StepModesReport(unittest.TestCase):
    def run_report(self, tables, results_text):
        with tempfile.TemporaryDirectory() as d:
            args = []
            for name, lines in tables.items():
                path = os.path.join(d, name + ".tsv")
                with open(path, "w") as f:
                    f.write(HEADER + "".join(lines))
                args.append(f"{name}={path}")
            results = os.path.join(d, "RESULTS.md")
            with open(results, "w") as f:
                f.write(results_text)
            subprocess.run([sys.executable, SCRIPT, "--results", results, "--tokens", "64",
                            "--offsets", "0,8"] + args, check=True)
            with open(results) as f:
                return f.read()

    def test_means_acceptance_and_section(self):
        a = [row(0, "stepquant6", 0.01), row(8, "stepquant6", 0.03),
             row(0, "stepquant6 light N=16 norefit", 0.02, light=0.9375),
             row(8, "stepquant6 light N=16 norefit", 0.06, light=0.9375),  # mean +0.04: ok
             row(0, "stepquant6 light N=16 absmax", 0.2),
             row(8, "stepquant6 light N=16 absmax", 0.0),
             row(0, "stepquant4", 0.40), row(8, "stepquant4", 0.40),
             row(0, "stepquant4 light N=16 norefit", 0.49),
             row(8, "stepquant4 light N=16 norefit", 0.51)]
        b = [row(0, "stepquant6", 0.0), row(8, "stepquant6", 0.0),
             row(0, "stepquant6 light N=16 norefit", 0.0),
             row(8, "stepquant6 light N=16 norefit", 0.0),
             row(0, "stepquant6 light N=16 absmax", 0.0),
             row(8, "stepquant6 light N=16 absmax", 0.0),
             row(0, "stepquant4", 0.001), row(8, "stepquant4", 0.001),
             # 1.25x of +0.001% is noise: +0.05% is the tolerance there.
             row(0, "stepquant4 light N=16 norefit", 0.04),
             row(8, "stepquant4 light N=16 norefit", 0.04)]
        first = self.run_report({"m1": a, "m2": b}, "# head\n\nkept\n")
        self.assertTrue(first.startswith("# head\n\nkept\n\n<!-- step-modes:"))
        self.assertIn("| stepquant6 | N=16 norefit | +0.040% ok", first)
        self.assertIn("94% light", first)
        # absmax: +0.1% mean on m1 fails the +0.05% rule.
        self.assertIn("| stepquant6 | N=16 absmax | +0.100% no", first)
        # stepquant4 on m1: +0.50% against +0.40% is within 1.25x (0.50).
        self.assertIn("| stepquant4 | N=16 norefit | +0.500% ok", first)
        self.assertIn("Holding on every model, stepquant6: N=16 norefit.", first)
        self.assertIn("Holding on every model, stepquant4: N=16 norefit.", first)
        # Rerun over its own output: the section is replaced, the rest kept.
        worse = b[:-1] + [row(8, "stepquant4 light N=16 norefit", 0.20)]
        again = self.run_report({"m1": a, "m2": worse}, first)
        self.assertEqual(again.count("<!-- step-modes:"), 1)
        self.assertTrue(again.startswith("# head\n\nkept\n\n"))
        self.assertIn("Holding on every model, stepquant4: none.", again)


if __name__ == "__main__":
    unittest.main()
