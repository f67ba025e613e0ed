#!/usr/bin/python3
"""Checks the Grafana dashboard's PromQL and data sources, and docs/metrics.md.

usage: check_dashboard.py PROMTOOL DASHBOARD_JSON METRICS_MD RULES_YAML
                          [--dashboard-tests TEST_YAML] [--source-dir DIR]

* every panel and every target uses the `$datasource` template variable;
* the `job` variable selects the job: every expression uses `$job` and none names a fixed
  job (`up`, which every scrape target has, would otherwise show other jobs' targets);
* a histogram_quantile() is combined (`and`) with a filter on traffic, so idle request
  types give no NaN series;
* every `expr` parses: template variables are substituted ($tenant, $instance, $job ->
  .*, $__rate_interval -> 5m, ...), the expressions are written as recording rules
  `dashboard:panel_<id>:<refId>` into a temporary rules file and `promtool check rules`
  runs on it; with --dashboard-tests, `promtool test rules` also runs that unit test file
  (which names `dashboard-rules.yaml` in rule_files) against them;
* every metric name an expression uses is documented in docs/metrics.md, is recorded by
  the rules file, or is Prometheus's own `up`;
* with --source-dir (the project root), the label values docs/metrics.md lists are the
  ones the code exports: request `type`s (protocol/frame.cpp, request_name), status
  `code`s (protocol/statepool.fbs, enum Status) and `codec`s (kernels/cpu/layout.cpp,
  to_string(CodecId), checked against enum CodecId).

Exit status: 0 when all checks pass, 1 when one fails, 77 when promtool is missing
(ctest reports the test as skipped).
"""
import argparse
import json
import shutil
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
    (r"\$\{?(tenant|instance|job)(:\w+)?\}?", ".*"),
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
        if word.lower() in KEYWORDS:  # also before "(": `a and on (x) (b)`
            continue
        following = e[m.end():].lstrip()
        if following.startswith("("):
            if word not in FUNCTIONS:
                raise ValueError(f"unknown function {word!r}")
            continue
        names.add(word)
    return names


def backticked(text):
    return re.findall(r"`([^`]+)`", text)


def paragraph_after(text, marker):
    """The text from `marker` to the next blank line ("" when `marker` is missing)."""
    start = text.find(marker)
    if start < 0:
        return ""
    end = text.find("\n\n", start)
    return text[start + len(marker):end if end >= 0 else len(text)]


def fbs_members(schema, kind, name):
    """Members of `enum NAME` / `union NAME` in a FlatBuffers schema, in order, as
    (member, comment) pairs."""
    m = re.search(r"^%s\s+%s\b[^{]*\{(.*?)^\}" % (kind, name), schema, re.M | re.S)
    if not m:
        raise ValueError(f"no {kind} {name} in the schema")
    members = []
    for line in m.group(1).splitlines():
        code, _, comment = line.partition("//")
        for word in re.findall(r"([A-Za-z_]\w*)\s*(?:=\s*\d+)?\s*(?:,|$)", code):
            members.append((word, comment.strip()))
    return members


def case_names(source, function, enum):
    """{enumerator: string} from the `case Enum::x: return "s";` lines of `function`."""
    start = source.find(function)
    if start < 0:
        raise ValueError(f"no {function} in the source")
    body = source[start:source.find("\n}\n", start)]
    return dict(re.findall(r"case\s+(?:\w+::)*%s::(\w+):\s*return\s+\"([^\"]+)\";" % enum, body))


def check_docs_against_code(metrics_md, source_dir):
    """Problems where docs/metrics.md's label values differ from what the code exports."""
    problems = []
    doc = open(metrics_md, encoding="utf-8").read()

    def read(rel):
        return open(os.path.join(source_dir, rel), encoding="utf-8").read()

    def compare(what, documented, exported, where):
        for v in sorted(exported - documented):
            problems.append(f"docs/metrics.md: {what} {v!r} ({where}) is not listed")
        for v in sorted(documented - exported):
            problems.append(f"docs/metrics.md: {what} {v!r} is listed but not exported ({where})")

    schema = read("protocol/statepool.fbs")

    # Request types: request_name() names every RequestBody member; NONE is "unknown".
    names = case_names(read("protocol/frame.cpp"), "request_name(", "RequestBody")
    for member, _ in fbs_members(schema, "union", "RequestBody"):
        if member not in names:
            problems.append(f"protocol/frame.cpp: request_name() has no case for {member}")
    types = set(names.values()) | {"unknown"}
    compare("request type", set(backticked(paragraph_after(doc, "`type` label values:"))), types,
            "protocol/frame.cpp request_name")
    count = re.search(r"All (\d+) `type` values", doc)
    if not count or int(count.group(1)) != len(types):
        problems.append(f"docs/metrics.md: should say \"All {len(types)} `type` values\"")

    # Status codes: every Status but ok, and those the schema marks reserved (never sent).
    codes = {m for m, comment in fbs_members(schema, "enum", "Status")
             if m != "ok" and not comment.startswith("reserved")}
    listed = set(backticked(paragraph_after(doc, "`code` is the status name from the wire schema:")))
    compare("status code", listed, codes, "protocol/statepool.fbs enum Status")

    # Codecs: the label is kernels::to_string(CodecId), which must name every CodecId.
    codec_names = case_names(read("kernels/cpu/layout.cpp"), "to_string(CodecId", "CodecId")
    for member, _ in fbs_members(schema, "enum", "CodecId"):
        if member not in codec_names:
            problems.append(f"kernels/cpu/layout.cpp: to_string(CodecId) has no case for {member}")
    row = re.search(r"^\|\s*`codec`\s*\|(.*)\|\s*$", doc, re.M)
    compare("codec", set(backticked(row.group(1))) if row else set(), set(codec_names.values()),
            "kernels/cpu/layout.cpp to_string(CodecId)")
    return problems


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
    parser = argparse.ArgumentParser(usage=__doc__)
    parser.add_argument("promtool")
    parser.add_argument("dashboard")
    parser.add_argument("metrics_md")
    parser.add_argument("rules_yaml")
    parser.add_argument("--dashboard-tests")
    parser.add_argument("--source-dir")
    args = parser.parse_args()
    promtool, dashboard, metrics_md, rules_yaml = (args.promtool, args.dashboard,
                                                   args.metrics_md, args.rules_yaml)
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
    for name in ("instance", "tenant", "job"):
        if name not in variables:
            problems.append(f"no `{name}` template variable")

    exprs = []  # (record name, where, substituted expression)
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
            # Under the Prometheus Operator the job is the Service's name: select it by $job.
            for m in re.finditer(r'\bjob\s*(?:=~|!~|!=|=)\s*"([^"]*)"', expr):
                if not re.fullmatch(r"\$\{?job(:\w+)?\}?", m.group(1)):
                    problems.append(f"{where}: fixed job matcher {m.group(0)!r}; use $job")
            if not re.search(r"\$\{?job\b", expr):
                problems.append(f"{where}: does not select the job with $job (for `up`, every "
                                "target of every job would show)")
            if "histogram_quantile" in expr and not re.search(r"\band\b", expr):
                problems.append(f"{where}: histogram_quantile without `and` on a traffic filter "
                                "gives NaN series for idle request types")
            for pattern, value in SUBSTITUTIONS:
                expr = re.sub(pattern, value, expr)
            if "$" in expr:
                problems.append(f"{where}: unknown template variable left in {expr!r}")
                continue
            record = f"dashboard:panel_{p.get('id')}:{t.get('refId')}"
            exprs.append((record, f"{where} target {t.get('refId')}", expr))
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
            for record, where, expr in exprs:
                out.write(f"      # {where}\n")
                out.write(f"      - record: {record}\n")
                out.write(f"        expr: {json.dumps(expr)}\n")
        result = subprocess.run([promtool, "check", "rules", rules],
                                capture_output=True, text=True)
        if result.returncode != 0:
            problems.append("promtool check rules failed on the dashboard's expressions:\n" +
                            result.stdout + result.stderr + "\n" + open(rules).read())
        elif args.dashboard_tests:
            tests = os.path.join(tmp, "dashboard.test.yaml")
            shutil.copyfile(args.dashboard_tests, tests)
            result = subprocess.run([promtool, "test", "rules", tests],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                problems.append(f"promtool test rules {args.dashboard_tests} failed:\n" +
                                result.stdout + result.stderr)

    if args.source_dir:
        try:
            problems += check_docs_against_code(metrics_md, args.source_dir)
        except (OSError, ValueError) as e:
            problems.append(f"cannot compare docs/metrics.md with the code: {e}")

    for p in problems:
        print("FAIL:", p)
    print(f"{len(exprs)} expressions checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
