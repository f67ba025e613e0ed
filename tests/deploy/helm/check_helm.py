#!/usr/bin/python3
"""The Helm chart charts/statepool rendered and linted by Helm itself (render_chart.py, in
the venv of scripts/helm-venv) and checked by the Kustomize tree's checker
(tests/deploy/kubernetes/check_kustomize.py: the same invariants, on the chart's output):

- `helm lint` of the chart passes with no warning (strict);
- every case below renders (the chart's own values and each file in
  charts/statepool/examples/), and its objects pass every invariant of the checker, its
  daemons' command lines `statepoold --print-config` (--statepoold);
- NOTES.txt names the socket and how to check readiness;
- on a cluster without the Prometheus Operator's CRDs the chart installs without its
  ServiceMonitor and PrometheusRule, and NOTES.txt says so;
- bad values are refused by values.schema.json, naming the key;
- with kubectl (1.21 or later), the chart and the Kustomize overlays give each daemon the
  same effective options and tenants for the same settings.

Exit status: 0 all good, 1 a check failed, 77 the helm venv could not be made (no Python
3.12, no network) unless CI=true (then 1). Needs python3-yaml.
"""

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # pragma: no cover
    sys.exit("check_helm.py: needs PyYAML (Debian package python3-yaml)")

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
SKIP = 77

# What each case must render (check_kustomize's expectations). A new example values file
# needs an entry.
CASES = {
    "values.yaml": {"file": None, "expect": {"kind": "gpu", "legacy_ipc": False},
                    "kustomize": "gpu"},
    "examples/gpu-legacy-ipc.yaml": {"expect": {"kind": "gpu", "legacy_ipc": True,
                                                "gpus": [0, 1, 2, 3]},
                                     "kustomize": "gpu-legacy-ipc"},
    "examples/gpu-tenants-redis.yaml": {"expect": {"kind": "gpu", "legacy_ipc": False,
                                                   "external_configmaps": ["statepool-plans"]}},
    "examples/cpu.yaml": {"expect": {"kind": "cpu", "legacy_ipc": False}, "kustomize": "cpu"},
    "examples/sidecar.yaml": {"expect": {"kind": "sidecar", "legacy_ipc": False},
                              "namespace": "engines", "kustomize": "sidecar"},
}
# Values the schema must refuse, and what the refusal must name.
BAD_VALUES = [
    ({"mode": "tpu"}, "/mode"),
    ({"gpu": {"count": "eight"}}, "/gpu/count"),
    ({"daemon": {"drainTimout": "20s"}}, "drainTimout"),
    ({"daemon": {"drainTimeout": "20 seconds"}}, "/daemon/drainTimeout"),
    ({"daemon": {"tenants": [{"quota": "1GiB"}]}}, "name"),
    ({"cpu": {"poolCapacity": "lots"}}, "/cpu/poolCapacity"),
    ({"daemon": {"apiAddress": "0.0.0.0:9465"}}, "/daemon/apiAddress"),
    ({"gpu": {"indices": [0, 0]}}, "/gpu/indices"),
    ({"updateStrategy": "Never"}, "/updateStrategy"),
]
LINT_SEVERITY = {0: "unknown", 1: "info", 2: "warning", 3: "error"}


def load_checker():
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    path = ROOT / "tests" / "deploy" / "kubernetes" / "check_kustomize.py"
    spec = importlib.util.spec_from_file_location("statepool_check_kustomize", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def helm_python(script):
    run = subprocess.run([script], capture_output=True, text=True, timeout=900)
    sys.stderr.write(run.stderr)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines or not os.access(lines[-1], os.X_OK):
        return None
    return lines[-1]


def render(python, chart, cases):
    with tempfile.TemporaryDirectory() as tmp:
        cases_path, out_path = os.path.join(tmp, "cases.json"), os.path.join(tmp, "out.json")
        with open(cases_path, "w", encoding="utf-8") as f:
            json.dump(cases, f)
        run = subprocess.run([python, str(HERE / "render_chart.py"), str(chart), cases_path,
                              out_path], capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, HELM_DRIVER="memory", PYTHONDONTWRITEBYTECODE="1"))
        if run.returncode != 0:
            raise RuntimeError(f"render_chart.py failed:\n{run.stdout}{run.stderr}")
        with open(out_path, encoding="utf-8") as f:
            return json.load(f)


def daemon_options(overlay):
    """Each daemon's effective options and tenants, by what it serves (GPU index, or the
    backend for the others)."""
    result = {}
    for d in overlay.daemons():
        key = f"gpu{d.opts['device']}" if d.backend == "cuda" else d.backend
        result[key] = (dict(d.opts), {n: t for n, t in d.tenants.items()})
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chart", type=pathlib.Path, default=ROOT / "charts" / "statepool")
    parser.add_argument("--helm-venv", default=str(ROOT / "scripts" / "helm-venv"))
    parser.add_argument("--kubectl", default="/usr/bin/kubectl")
    parser.add_argument("--statepoold", help="run each daemon's flags through --print-config")
    args = parser.parse_args()

    python = helm_python(args.helm_venv)
    if python is None:
        if os.environ.get("CI") == "true":
            print("FAILED: the helm venv could not be made (CI=true: not skipped), see above")
            return 1
        print("SKIPPED: the helm venv could not be made (Python 3.12 or newer and PyPI's "
              "helm-sdkpy are needed), see above")
        return SKIP

    checker = load_checker()
    errors = []
    examples = sorted(f"examples/{p.name}" for p in (args.chart / "examples").glob("*.yaml"))
    for name in examples:
        if name not in CASES:
            errors.append(f"{name} is not in check_helm.py's CASES: say what it must render")
    cases = {}
    for name, case in CASES.items():
        values = None
        if name != "values.yaml":
            path = args.chart / name
            if not path.is_file():
                errors.append(f"{name} is missing")
                continue
            values = yaml.safe_load(path.read_text(encoding="utf-8"))
        cases[name] = {"values": values, "namespace": case.get("namespace", "statepool")}
    for i, (values, _) in enumerate(BAD_VALUES):
        cases[f"bad-{i}"] = {"values": values}
    cases["no-operator"] = {"values": None, "without": ["monitoring.coreos.com/v1"]}

    out = render(python, args.chart, cases)

    lint = out.pop("lint")
    for m in lint.get("Messages") or []:
        if m.get("Severity", 0) >= 2:
            errors.append(f"helm lint: {LINT_SEVERITY.get(m['Severity'])} in {m.get('Path')}")
    if lint.get("Errors"):
        errors.append(f"helm lint: {len(lint['Errors'])} errors")
    print(f"helm lint: {lint.get('TotalChartsLinted')} chart, "
          f"{len(lint.get('Messages') or [])} messages, none above info" if not errors else "")

    for i, (values, must_name) in enumerate(BAD_VALUES):
        result = out[f"bad-{i}"]
        if "error" not in result:
            errors.append(f"bad values {values} were accepted")
        elif "schema" not in result["error"] or must_name not in result["error"]:
            errors.append(f"bad values {values}: the refusal does not name {must_name}: "
                          f"{result['error']}")
    print(f"schema: {len(BAD_VALUES)} bad values refused, each naming its key")

    bare = out.pop("no-operator")
    if "error" in bare:
        errors.append(f"without the Prometheus Operator: helm install failed: {bare['error']}")
    else:
        kinds = [d["kind"] for d in yaml.safe_load_all(bare["manifest"]) if d is not None]
        if "ServiceMonitor" in kinds or "PrometheusRule" in kinds or "DaemonSet" not in kinds:
            errors.append(f"without the Prometheus Operator the chart renders {sorted(set(kinds))}")
        if "no ServiceMonitor" not in bare.get("notes", ""):
            errors.append("without the Prometheus Operator NOTES.txt does not say what was left out")
        print("without the Prometheus Operator: installs, no ServiceMonitor or PrometheusRule")

    ctx = checker.Context(ROOT / "charts", checker.load_gpus(ROOT / "deploy" / "kubernetes"),
                          args.statepoold)
    overlays = {}
    for name, case in CASES.items():
        if name not in cases:
            continue
        result = out[name]
        if "error" in result:
            errors.append(f"{name}: helm install failed: {result['error']}")
            continue
        docs = [d for d in yaml.safe_load_all(result["manifest"]) if d is not None]
        expect = dict(case["expect"], release_namespace=cases[name]["namespace"])
        overlays[name] = checker.Overlay(f"chart {name}", docs, expect)
        notes = result.get("notes", "")
        if "statepool.sock" not in notes or "readyz" not in notes:
            errors.append(f"{name}: NOTES.txt does not name the socket and the readiness check")
    errors += checker.run_checks(overlays, {}, ctx)
    errors += checker.validate_flags(overlays, ctx)

    # The same daemon options as the Kustomize overlays for the same settings.
    kubectl_ok = os.path.isfile(args.kubectl) and os.access(args.kubectl, os.X_OK)
    if kubectl_ok and checker.kubectl_version(args.kubectl)[:2] >= checker.MIN_KUBECTL:
        compared = 0
        for name, case in CASES.items():
            overlay_name = case.get("kustomize")
            if overlay_name is None or name not in overlays:
                continue
            docs = checker.render(args.kubectl, ROOT / "deploy" / "kubernetes" / "overlays" / overlay_name)
            theirs = daemon_options(checker.Overlay(overlay_name, docs, {}))
            ours = daemon_options(overlays[name])
            for key, (opts, tenants) in ours.items():
                if key not in theirs:
                    errors.append(f"chart {name}: daemon {key} has no counterpart in overlays/{overlay_name}")
                    continue
                other_opts, other_tenants = theirs[key]
                for flag in sorted(set(opts) | set(other_opts)):
                    if opts.get(flag) != other_opts.get(flag):
                        errors.append(f"chart {name} daemon {key}: --{flag} {opts.get(flag)!r}, "
                                      f"overlays/{overlay_name}: {other_opts.get(flag)!r}")
                if tenants != other_tenants:
                    errors.append(f"chart {name} daemon {key}: tenants {tenants}, "
                                  f"overlays/{overlay_name}: {other_tenants}")
                compared += 1
        print(f"{compared} daemons' options equal to the Kustomize overlays'")
    else:
        ctx.notes.append(f"note: no kubectl >= 1.21 at {args.kubectl}: the chart was not "
                         "compared with the Kustomize overlays")
    return checker.report(overlays.values(), ctx, errors)


if __name__ == "__main__":
    sys.exit(main())
