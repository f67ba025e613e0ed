#!/usr/bin/python3
"""Checks the Grafana dashboard's PromQL and data sources.

usage: check_dashboard.py PROMTOOL DASHBOARD_JSON METRICS_MD RULES_YAML

* every panel and every target uses the `$datasource` template variable;
* every `expr` parses: template variables are substituted ($tenant -> .*,
  $__rate_interval -> 5m, ...), the expressions are written as recording rules into a
  temporary rules file and `promtool check rules` runs on it;
* every metric name an expression uses is documented in docs/metrics.md, is recorded by
  the rules file, or is Prometheus's own `up`.

Exit status: 0 when all checks pass, 1 when one fails, 77 when promtool is missing
(ctest reports the test as skipped).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77

# Grafana variables -> values that keep the expression valid PromQL.
SUBSTITUTIONS = [
    (r"\$__rate_interval|\$\{__rate_interval\}", "5m"),
    (r"\$__interval|\$\{__interval\}", "1m"),
    (r"\$__range|\$\{__range\}", "1h"),
    (r"\$__range_s|\$\{__range_s\}", "3600"),
    (r"\$\{?(tenant|instance)(:\w+)?\}?", ".*"),
]

FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count_over_time", "delta", "deriv", "exp", "floor",
    "histogram_quantile", "idelta", "increase", "irate", "label_replace", "label_join",
    "last_over_time", "ln", "log2", "log10", "max_over_time", "min_over_time",
    "predict_linear", "quantile_over_time", "rate", "resets", "round", "scalar", "sort",
    "sort_desc", "sqrt", "sum_over_time", "time", "timestamp", "vector",
    # aggregations
    "sum", "avg", "min", "max", "count", "count_values", "group", "stddev", "stdvar",
    "topk", "bottomk", "quantile",
}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "bool", "offset", "inf", "nan"}


def documented_metrics(metrics_md):
    names = {"up"}
    text = open(metrics_md, encoding="utf-8").read()
    for m in re.finditer(r"^\|\s*`([a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|\s*(\w+)", text, re.M):
        name, kind = m.group(1), m.group(2)
        names.add(name)
        if kind in ("histogram", "summary"):
            names.update({name + "_bucket", name + "_sum", name + "_count"})
    # The exporter's own metrics are named in prose.
    names.update(re.findall(r"`(exposer_[a-z_]+)`", text))
    return names


def recorded_metrics(rules_yaml):
    text = open(rules_yaml, encoding="utf-8").read()
    return set(re.findall(r"^\s*-?\s*record:\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*$", text, re.M))


def metric_names(expr):
    """Identifiers in `expr` that are metric names (not functions, labels or keywords)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges and subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\b\d+(\.\d+)?([eE][-+]?\d+)?[smhdwy]?\b", " ", e)  # numbers, durations
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word = m.group(0)
        following = e[m.end():].lstrip()
        if following.startswith("("):
            if word not in FUNCTIONS:
                raise ValueError(f"unknown function {word!r}")
            continue
        if word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def uses_datasource_variable(ds):
    if isinstance(ds, str):
        return ds in ("$datasource", "${datasource}")
    if isinstance(ds, dict):
        return ds.get("uid") in ("$datasource", "${datasource}")
    return False


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    promtool, dashboard, metrics_md, rules_yaml = sys.argv[1:]
    if not (os.path.isfile(promtool) and os.access(promtool, os.X_OK)):
        print(f"SKIPPED: promtool not found at {promtool}")
        return SKIP
    dash = json.load(open(dashboard, encoding="utf-8"))
    known = documented_metrics(metrics_md) | recorded_metrics(rules_yaml)
    problems = []

    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds_var = variables.get("datasource")
    if not ds_var or ds_var.get("type") != "datasource" or ds_var.get("query") != "prometheus":
        problems.append("no `datasource` template variable of type datasource, query prometheus")
    if "tenant" not in variables:
        problems.append("no `tenant` template variable")

    exprs = []  # (where, substituted expression)
    for v in variables.values():
        if v.get("type") == "query" and not uses_datasource_variable(v.get("datasource")):
            problems.append(f"variable {v['name']}: does not use $datasource")
    for p in walk_panels(dash.get("panels", [])):
        where = f"panel {p.get('id')} {p.get('title')!r}"
        if p.get("type") == "row":
            continue
        if not uses_datasource_variable(p.get("datasource")):
            problems.append(f"{where}: datasource is not $datasource")
        targets = p.get("targets", [])
        if not targets:
            problems.append(f"{where}: no targets")
        for t in targets:
            if not uses_datasource_variable(t.get("datasource", p.get("datasource"))):
                problems.append(f"{where} target {t.get('refId')}: datasource is not $datasource")
            expr = t.get("expr", "")
            if not expr.strip():
                problems.append(f"{where} target {t.get('refId')}: empty expr")
                continue
            for pattern, value in SUBSTITUTIONS:
                expr = re.sub(pattern, value, expr)
            if "$" in expr:
                problems.append(f"{where}: unknown template variable left in {expr!r}")
                continue
            exprs.append((f"{where} target {t.get('refId')}", expr))
            try:
                for name in sorted(metric_names(expr) - known):
                    problems.append(f"{where}: metric {name!r} is not in docs/metrics.md "
                                    "nor recorded by the rules file")
            except ValueError as e:
                problems.append(f"{where}: {e}")

    with tempfile.TemporaryDirectory() as tmp:
        rules = os.path.join(tmp, "dashboard-rules.yaml")
        with open(rules, "w", encoding="utf-8") as out:
            out.write("groups:\n  - name: dashboard\n    rules:\n")
            for i, (where, expr) in enumerate(exprs):
                out.write(f"      # {where}\n")
                out.write(f"      - record: dashboard:expr_{i}\n")
                out.write(f"        expr: {json.dumps(expr)}\n")
        result = subprocess.run([promtool, "check", "rules", rules],
                                capture_output=True, text=True)
        if result.returncode != 0:
            problems.append("promtool check rules failed on the dashboard's expressions:\n" +
                            result.stdout + result.stderr + "\n" + open(rules).read())

    for p in problems:
        print("FAIL:", p)
    print(f"{len(exprs)} expressions checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
