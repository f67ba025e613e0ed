#!/usr/bin/python3
"""Renders every kustomization under deploy/kubernetes/overlays and /examples with
`kubectl kustomize` and checks the invariants that keep the manifests and the daemon's
flags in agreement (docs/operations.md §12):

- every container has CPU and memory requests and limits (requests <= limits), drops
  every capability, cannot gain privileges, and runs as a non-root uid; the one exception
  is the DaemonSets' chown init container "socket-dir", which may run as root with
  CHOWN alone;
- every volume is mounted and every mount names a volume; ConfigMaps that pods mount
  exist in the rendered output;
- statepoold's effective options (args over its --config file, read from the ConfigMap):
  the socket lies in a writable mount of a hostPath (DaemonSets) or emptyDir (sidecar)
  volume; the probes and the containerPort "metrics" use --metrics-address's port, which
  is not loopback; the API stays on loopback or has a token; terminationGracePeriodSeconds
  exceeds --drain-timeout by 5 s at least; --workers is set and within the CPU limit; the
  socket mode is 0660-like; the host backend's memory limit holds --pool-capacity +
  --staging-capacity (+ --snapshot-host-capacity);
- the per-GPU DaemonSets: --device N equals the hostPath /run/statepool/gpuN, the pod
  label statepool/gpu, and the node affinity nvidia.com/gpu.count > N, for N = 0 ...
  GPUS-1 of generate.py; the NVIDIA runtime and environment; no container asks for an
  nvidia.com/* resource;
- the sidecar: a native sidecar (restartPolicy Always, startup probe), the engine mounts
  the socket's volume and names the socket in STATEPOOL_SOCKET, its uid is not the
  daemon's and is in a tenant's uids, fsGroup is the daemon's group, nothing on the host;
- hostIPC/hostPID only in the legacy-IPC overlay, and there on every DaemonSet;
- the Service selects exactly the pods that run statepoold, its port names the
  containers' "metrics" port, the ServiceMonitor selects the Service and scrapes /metrics;
- the PrometheusRule's spec.groups equal charts/prometheus/statepool-rules.yaml's groups,
  and the dashboard ConfigMap (label grafana_dashboard "1") holds
  charts/grafana/statepool-dashboard.json byte for byte;
- images name no registry host;
- with --statepoold, each daemon's effective command line passes `statepoold
  --print-config` (the cuda ones only on a build with CUDA).

--selftest breaks each invariant on purpose in a copy of the rendered objects and fails
unless the checks catch every breakage.

Exit status: 0 all good, 1 a check failed, 77 kubectl is missing or older than 1.21
(ctest reports that as skipped). Needs python3-yaml.
"""

import argparse
import copy
import importlib.util
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # pragma: no cover
    sys.exit("check_kustomize.py: needs PyYAML (Debian package python3-yaml)")

SKIP = 77
MIN_KUBECTL = (1, 21)

# What each overlay must be. A new overlay needs an entry (and the thought behind it).
OVERLAYS = {
    "gpu": {"kind": "gpu", "legacy_ipc": False},
    "gpu-legacy-ipc": {"kind": "gpu", "legacy_ipc": True},
    "cpu": {"kind": "cpu", "legacy_ipc": False},
    "sidecar": {"kind": "sidecar", "legacy_ipc": False},
}
EXAMPLES = {
    "engine-gpu": {"serves": "gpu"},
}

# statepoold's defaults for the options checked here (docs/operations.md §1).
DEFAULTS = {
    "socket": "/run/statepool/statepool.sock",
    "socket-mode": "0660",
    "metrics-address": "127.0.0.1:9464",
    "api-address": "127.0.0.1:9465",
    "drain-timeout": "10s",
    "backend": "host",
    "device": "0",
    "pool-capacity": "1GiB",
    "staging-capacity": "16GiB",
    "snapshot-host-capacity": "0",
    "workers": "0",
    "after-handover": "exit",
}
FLAGS_WITHOUT_VALUE = {"help", "version", "print-config", "take-over"}
REPEATABLE = {"tenant", "plan"}
ROOT_ALLOWED = {"socket-dir": {"CHOWN"}}  # init container name -> capabilities it may add
GRACE_MARGIN_S = 5
POD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "Pod"}
SOCKET_PATH_MAX = 107
# An option whose value comes from a Secret (through $(VAR) of a secretKeyRef) is checked
# as this placeholder, and run through --print-config with the flag's stand-in below.
SECRET_MARK = "<secret "
SECRET_STAND_INS = {"snapshot-remote": "redis://from-a-secret.invalid:6379"}


# ---------------------------------------------------------------------------------------
# Parsers for the daemon's and Kubernetes' value syntaxes.

def parse_size(text):
    """statepool sizes (docs/operations.md, "Sizes"); None for a fraction or a bad value."""
    m = re.fullmatch(r"\s*(\d*\.?\d+)\s*([A-Za-z]*)\s*", str(text))
    if not m:
        return None
    number, unit = float(m.group(1)), m.group(2).lower()
    binary = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
              "p": 1 << 50, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
              "tib": 1 << 40, "pib": 1 << 50}
    decimal = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15}
    factor = binary.get(unit, decimal.get(unit))
    return None if factor is None else int(number * factor)


def parse_duration_s(text):
    text = str(text).strip()
    if text == "0":
        return 0.0
    m = re.fullmatch(r"(\d*\.?\d+)(ms|s|min|m|h)", text)
    if not m:
        return None
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]


def parse_quantity(text):
    """A Kubernetes resource quantity as a float (CPU in cores, memory in bytes)."""
    m = re.fullmatch(r"(\d*\.?\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?", str(text).strip())
    if not m:
        return None
    factor = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
              "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
              "Ei": 2**60}[m.group(2)]
    return float(m.group(1)) * factor


def parse_address(text):
    """(host, port) of an IP:port option, or None when disabled."""
    text = str(text).strip()
    if text in ("", "off", "none"):
        return None
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d+)", text) or re.fullmatch(r"([0-9.]+):(\d+)", text)
    if not m:
        raise ValueError(f"not IP:port: {text!r}")
    return m.group(1), int(m.group(2))


def is_loopback(host):
    return host.startswith("127.") or host == "::1"


def expand_env(value, env):
    """The kubelet's $(VAR) expansion from the container's literal env; $$ escapes."""
    def repl(m):
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$\([A-Za-z_][A-Za-z0-9_]*\)|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", repl, value)


def parse_daemon_argv(argv):
    """statepoold's flags -> (dict, problems)."""
    opts, problems, i = {}, [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            problems.append(f"argument {arg!r} is not a --flag")
            i += 1
            continue
        if "=" in arg:
            key, value = arg[2:].split("=", 1)
        elif arg[2:] in FLAGS_WITHOUT_VALUE:
            key, value = arg[2:], ""
        elif i + 1 < len(argv):
            key, value = arg[2:], argv[i + 1]
            i += 1
        else:
            problems.append(f"{arg} has no value")
            break
        if key in opts and key not in REPEATABLE:
            problems.append(f"--{key} is given twice (statepoold refuses that)")
        opts[key] = value
        i += 1
    return opts, problems


def parse_ini(text):
    """statepoold's config file -> (top-level options, tenants, problems)."""
    top, tenants, problems, section = {}, {}, [], None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"\[(.+)\]", line)
        if m:
            section = m.group(1)
            if not section.startswith("tenant."):
                problems.append(f"line {number}: section [{section}] (only [tenant.NAME] exist)")
            tenants.setdefault(section[len("tenant."):], {"uids": [], "gids": []})
            continue
        if "=" not in line:
            problems.append(f"line {number}: {raw!r} is not key = value")
            continue
        key, value = (part.strip() for part in line.split("=", 1))
        if section is None:
            if key in top and key not in REPEATABLE:
                problems.append(f"line {number}: {key} given twice")
            top[key] = value
        elif key in ("uids", "gids"):
            name = section[len("tenant."):]
            tenants[name][key] += [int(v) for v in value.split(",") if v.strip()]
    return top, tenants, problems


def image_registry_host(image):
    first = image.split("/", 1)[0] if "/" in image else ""
    return first if first and ("." in first or ":" in first or first == "localhost") else None


# ---------------------------------------------------------------------------------------
# Access to rendered objects.

def pod_template(doc):
    kind = doc.get("kind")
    if kind == "Pod":
        return doc.get("metadata", {}), doc.get("spec", {})
    if kind in POD_KINDS:
        template = doc.get("spec", {}).get("template", {})
        return template.get("metadata", {}), template.get("spec", {})
    if kind == "CronJob":
        template = doc["spec"]["jobTemplate"]["spec"]["template"]
        return template.get("metadata", {}), template.get("spec", {})
    return None


def all_containers(spec):
    return [("initContainers", c) for c in spec.get("initContainers") or []] + \
           [("containers", c) for c in spec.get("containers") or []]


def is_daemon(container):
    command = container.get("command") or []
    return container.get("name") == "statepoold" or \
        (bool(command) and command[0].rsplit("/", 1)[-1] == "statepoold")


def literal_env(container):
    return {e["name"]: e.get("value", "") for e in container.get("env") or [] if "valueFrom" not in e}


def secret_env(container):
    """Variables from a Secret's key, as a placeholder naming it (their value is not in the
    manifests)."""
    result = {}
    for e in container.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            result[e["name"]] = f"{SECRET_MARK}{ref.get('name')}/{ref.get('key')}>"
    return result


def effective(container, spec, field):
    value = (container.get("securityContext") or {}).get(field)
    return value if value is not None else (spec.get("securityContext") or {}).get(field)


def name_of(doc):
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def find_mount(container, path):
    """The mount of this container that holds path (the longest mountPath prefix)."""
    best = None
    for mount in container.get("volumeMounts") or []:
        mp = mount["mountPath"].rstrip("/") or "/"
        if path == mp or path.startswith(mp + "/") or mp == "/":
            if best is None or len(mp) > len(best["mountPath"].rstrip("/")):
                best = mount
    return best


def volume(spec, name):
    for v in spec.get("volumes") or []:
        if v.get("name") == name:
            return v
    return None


def resolve_port(container, port):
    if isinstance(port, int):
        return port
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return p.get("containerPort")
    return None


def required_node_terms(spec):
    return (((spec.get("affinity") or {}).get("nodeAffinity") or {})
            .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []


class Daemon:
    """One statepoold container with its effective options."""

    def __init__(self, overlay, doc, spec, meta, field, container):
        self.overlay, self.doc, self.spec, self.meta = overlay, doc, spec, meta
        self.field, self.container = field, container
        self.where = f"{overlay.name}: {name_of(doc)} container {container.get('name')}"
        self.env = literal_env(container)
        self.secret_env = secret_env(container)
        expand = dict(self.env, **self.secret_env)
        argv = [expand_env(a, expand) for a in container.get("args") or []]
        command = container.get("command") or []
        argv = [expand_env(a, expand) for a in command[1:]] + argv
        self.argv = argv
        self.args, self.problems = parse_daemon_argv(argv)
        for a in argv:
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                self.problems.append(f"{a}: $({var}) is not in the container's env (the kubelet "
                                     "leaves it as it is)")
        self.file, self.tenants, self.config_text = {}, {}, None
        if "config" in self.args:
            self._read_config(self.args["config"])
        self.opts = dict(DEFAULTS)
        self.opts.update(self.file)
        self.opts.update(self.args)

    def _read_config(self, path):
        mount = find_mount(self.container, path)
        if mount is None:
            self.problems.append(f"--config {path} is in no volume mount")
            return
        vol = volume(self.spec, mount["name"]) or {}
        cm = vol.get("configMap")
        if cm is None:
            self.problems.append(f"--config {path}: volume {mount['name']} is not a ConfigMap")
            return
        if mount.get("subPath"):
            key = mount["subPath"]
        else:
            key = path[len(mount["mountPath"].rstrip("/")) + 1:]
        for item in cm.get("items") or []:
            if item.get("path") == key:
                key = item["key"]
        data = self.overlay.configmap_data(cm["name"])
        if data is None or key not in data:
            self.problems.append(f"--config {path}: ConfigMap {cm['name']} has no key {key!r}")
            return
        self.config_text = data[key]
        self.file, self.tenants, problems = parse_ini(self.config_text)
        self.problems += [f"--config {path}: {p}" for p in problems]

    @property
    def backend(self):
        return self.opts["backend"]

    def device(self):
        try:
            return int(self.opts["device"])
        except ValueError:
            return None


class Overlay:
    def __init__(self, name, docs, expect):
        self.name, self.docs, self.expect = name, docs, expect
        self.errors = []

    def err(self, where, message):
        self.errors.append(f"{where}: {message}")

    def of_kind(self, kind):
        return [d for d in self.docs if d.get("kind") == kind]

    def configmap_data(self, name):
        for d in self.of_kind("ConfigMap"):
            if d["metadata"]["name"] == name:
                return d.get("data") or {}
        return None

    def workloads(self):
        for doc in self.docs:
            pt = pod_template(doc)
            if pt is not None:
                yield doc, pt[0], pt[1]

    def daemons(self):
        result = []
        for doc, meta, spec in self.workloads():
            for field, c in all_containers(spec):
                if is_daemon(c):
                    result.append(Daemon(self, doc, spec, meta, field, c))
        return result


# ---------------------------------------------------------------------------------------
# The checks.

class Context:
    def __init__(self, charts, gpus, statepoold=None):
        rules_text = (charts / "prometheus" / "statepool-rules.yaml").read_text(encoding="utf-8")
        self.rule_groups = yaml.safe_load(rules_text)["groups"]
        self.dashboard_path = charts / "grafana" / "statepool-dashboard.json"
        self.dashboard_bytes = self.dashboard_path.read_bytes()
        self.gpus = gpus
        self.statepoold = statepoold
        self.notes = []


def check_containers(ov, doc, meta, spec):
    where0 = f"{ov.name}: {name_of(doc)}"
    for field, c in all_containers(spec):
        where = f"{where0} {field[:-1]} {c.get('name')}"
        res = c.get("resources") or {}
        for part in ("requests", "limits"):
            for r in ("cpu", "memory"):
                if r not in (res.get(part) or {}):
                    ov.err(where, f"no resources.{part}.{r}")
        for r in ("cpu", "memory"):
            req, lim = (res.get("requests") or {}).get(r), (res.get("limits") or {}).get(r)
            if req is not None and lim is not None and parse_quantity(req) > parse_quantity(lim):
                ov.err(where, f"resources.requests.{r} {req} is above the limit {lim}")
        sc = c.get("securityContext") or {}
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            ov.err(where, "securityContext.capabilities.drop lacks ALL")
        if sc.get("allowPrivilegeEscalation") is not False:
            ov.err(where, "securityContext.allowPrivilegeEscalation is not false")
        if sc.get("privileged"):
            ov.err(where, "runs privileged")
        uid = effective(c, spec, "runAsUser")
        added = set(caps.get("add") or [])
        if c.get("name") in ROOT_ALLOWED and field == "initContainers":
            if not added <= ROOT_ALLOWED[c["name"]]:
                ov.err(where, f"adds capabilities {sorted(added)}; only {sorted(ROOT_ALLOWED[c['name']])} allowed")
        else:
            if added:
                ov.err(where, f"adds capabilities {sorted(added)}")
            if uid is None or int(uid) == 0:
                ov.err(where, f"runAsUser is {uid!r}: must be a non-root uid")
            if effective(c, spec, "runAsNonRoot") is not True:
                ov.err(where, "runAsNonRoot is not true")
        image = c.get("image", "")
        host = image_registry_host(image)
        if host:
            ov.err(where, f"image {image!r} names a registry host ({host})")
        if ":" not in image.rsplit("/", 1)[-1] and "@" not in image:
            ov.err(where, f"image {image!r} has no tag")


def check_volumes(ov, doc, meta, spec):
    where = f"{ov.name}: {name_of(doc)}"
    declared = {v["name"]: v for v in spec.get("volumes") or []}
    mounted = set()
    for field, c in all_containers(spec):
        for m in c.get("volumeMounts") or []:
            mounted.add(m["name"])
            if m["name"] not in declared:
                ov.err(where, f"container {c.get('name')} mounts undeclared volume {m['name']}")
    for name, v in declared.items():
        if name not in mounted:
            ov.err(where, f"volume {name} is not mounted by any container")
        cm = v.get("configMap")
        if cm is not None and not cm.get("optional") and ov.configmap_data(cm["name"]) is None \
                and ov.expect.get("kind") != "example" \
                and cm["name"] not in ov.expect.get("external_configmaps", ()):
            ov.err(where, f"volume {name}: ConfigMap {cm['name']} is not in the output")


def check_host_namespaces(ov, doc, meta, spec):
    where = f"{ov.name}: {name_of(doc)}"
    legacy = ov.expect.get("legacy_ipc", False)
    for field in ("hostIPC", "hostPID", "hostNetwork"):
        value = bool(spec.get(field))
        if field == "hostNetwork":
            if value:
                ov.err(where, "hostNetwork: the daemons listen on the pod's own address")
            continue
        if legacy and doc.get("kind") == "DaemonSet" and not value:
            ov.err(where, f"{field} is not true in the legacy-IPC overlay")
        if not legacy and value:
            ov.err(where, f"{field} is true: only legacy CUDA IPC across pods needs it "
                          "(overlays/gpu-legacy-ipc)")


def check_daemon(ov, ctx, d):
    w = d.where
    c, spec, doc = d.container, d.spec, d.doc
    for p in d.problems:
        ov.err(w, p)
    daemonset = doc.get("kind") == "DaemonSet"

    # image
    image = c.get("image", "")
    repo, _, tag = image.rpartition(":")
    if repo.rsplit("/", 1)[-1] != "statepool":
        ov.err(w, f"image {image!r} is not the statepool image")
    if d.backend == "cuda" and not tag.endswith("-cuda"):
        ov.err(w, f"backend cuda with image {image!r}: the CUDA variant is tagged ...-cuda")

    # socket
    socket = d.opts["socket"]
    if not socket.startswith("/"):
        ov.err(w, f"--socket {socket} is not absolute")
    if len(socket.encode()) > SOCKET_PATH_MAX:
        ov.err(w, f"--socket {socket} is longer than {SOCKET_PATH_MAX} bytes")
    socket_dir = socket.rsplit("/", 1)[0] or "/"
    mount = find_mount(c, socket_dir)
    socket_volume = None
    if mount is None:
        ov.err(w, f"the socket {socket} is in no volume mount (its directory must be shared)")
    else:
        if mount.get("readOnly"):
            ov.err(w, f"the socket's mount {mount['mountPath']} is read-only")
        if mount.get("subPath") or mount.get("subPathExpr"):
            ov.err(w, f"the socket's mount {mount['mountPath']} uses a subPath")
        socket_volume = volume(spec, mount["name"])
        if socket_volume is None:
            pass  # reported by check_volumes
        elif daemonset and "hostPath" not in socket_volume:
            ov.err(w, f"the socket's volume {mount['name']} is not a hostPath (engines are in other pods)")
        elif not daemonset and "emptyDir" not in socket_volume:
            ov.err(w, f"the socket's volume {mount['name']} is not an emptyDir (sidecar)")
    d.socket_mount, d.socket_volume = mount, socket_volume

    # metrics address, ports, probes
    try:
        metrics = parse_address(d.opts["metrics-address"])
    except ValueError as e:
        ov.err(w, f"--metrics-address: {e}")
        metrics = None
    if metrics is None:
        ov.err(w, "--metrics-address is off: the probes and Prometheus need it")
    else:
        host, port = metrics
        if is_loopback(host):
            ov.err(w, f"--metrics-address {host}:{port} is loopback: the kubelet and Prometheus "
                      "reach the pod's address")
        named = [p for p in c.get("ports") or [] if p.get("name") == "metrics"]
        if len(named) != 1 or named[0].get("containerPort") != port:
            ov.err(w, f"containerPort named metrics is not {port} (the --metrics-address port)")
        for probe, paths in (("livenessProbe", {"/healthz"}), ("readinessProbe", {"/readyz"}),
                             ("startupProbe", {"/readyz", "/healthz"})):
            spec_probe = c.get(probe)
            if not spec_probe:
                ov.err(w, f"no {probe}")
                continue
            get = spec_probe.get("httpGet")
            if not get:
                ov.err(w, f"{probe} is not an httpGet probe")
                continue
            if resolve_port(c, get.get("port")) != port:
                ov.err(w, f"{probe} port {get.get('port')!r} is not the --metrics-address port {port}")
            if get.get("path") not in paths:
                ov.err(w, f"{probe} path {get.get('path')!r} is not {' or '.join(sorted(paths))}")
            if get.get("scheme", "HTTP") != "HTTP":
                ov.err(w, f"{probe} scheme is not HTTP")
    d.metrics_port = metrics[1] if metrics else None

    # API
    try:
        api = parse_address(d.opts["api-address"])
    except ValueError as e:
        ov.err(w, f"--api-address: {e}")
        api = None
    if api is not None and not is_loopback(api[0]):
        token = d.opts.get("api-token-file")
        if not token:
            ov.err(w, "--api-address off loopback without --api-token-file")
        else:
            m = find_mount(c, token)
            if m is None or "secret" not in (volume(spec, m["name"]) or {}):
                ov.err(w, f"--api-token-file {token} is not in a mounted Secret")

    # drain vs grace period
    drain = parse_duration_s(d.opts["drain-timeout"])
    grace = spec.get("terminationGracePeriodSeconds")
    if drain is None:
        ov.err(w, f"--drain-timeout {d.opts['drain-timeout']!r} is not a duration")
    elif grace is None:
        ov.err(w, "terminationGracePeriodSeconds is not set (the default 30s is not "
                  "derived from --drain-timeout)")
    elif grace < drain + GRACE_MARGIN_S:
        ov.err(w, f"terminationGracePeriodSeconds {grace} is not above --drain-timeout "
                  f"{d.opts['drain-timeout']} by {GRACE_MARGIN_S}s (the kubelet would SIGKILL a "
                  "drain in progress)")

    # workers within the CPU limit
    cpu_limit = parse_quantity(((c.get("resources") or {}).get("limits") or {}).get("cpu", "0")) or 0
    try:
        workers = int(d.opts["workers"])
    except ValueError:
        workers = -1
    if workers <= 0:
        ov.err(w, "--workers is not set: the default (one per core) counts the node's cores, "
                  "not the CPU limit")
    elif cpu_limit and workers > math.ceil(cpu_limit):
        ov.err(w, f"--workers {workers} is above the CPU limit {cpu_limit:g}")

    # security of the daemon itself
    sc = c.get("securityContext") or {}
    if sc.get("readOnlyRootFilesystem") is not True:
        ov.err(w, "readOnlyRootFilesystem is not true")
    uid, gid = effective(c, spec, "runAsUser"), effective(c, spec, "runAsGroup")
    if gid is None:
        ov.err(w, "runAsGroup is not set: the socket's group would be the image's")
    d.uid, d.gid = uid, gid

    # socket mode and group
    try:
        mode = int(str(d.opts["socket-mode"]), 8)
        if mode & 0o007 or mode & 0o060 != 0o060 or mode & 0o600 != 0o600:
            ov.err(w, f"--socket-mode {d.opts['socket-mode']}: the owner and the group need rw, "
                      "others nothing (0660)")
    except ValueError:
        ov.err(w, f"--socket-mode {d.opts['socket-mode']!r} is not octal")
    if d.opts.get("socket-group"):
        ov.err(w, "--socket-group names a group of the image; the socket's group comes from "
                  "runAsGroup / fsGroup instead")
    if not daemonset:
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        if fs_group is None or fs_group != gid:
            ov.err(w, f"pod fsGroup {fs_group} is not the daemon's runAsGroup {gid} (the socket's "
                      "group in the emptyDir)")

    # backend
    if d.backend == "cuda":
        check_cuda_daemon(ov, d)
    elif d.backend == "host":
        check_host_daemon(ov, d)
    else:
        ov.err(w, f"unknown --backend {d.backend}")


def check_cuda_daemon(ov, d):
    w, spec, c, doc = d.where, d.spec, d.container, d.doc
    if spec.get("runtimeClassName") != "nvidia":
        ov.err(w, "backend cuda without runtimeClassName nvidia")
    env = d.env
    if env.get("NVIDIA_VISIBLE_DEVICES") != "all":
        ov.err(w, "backend cuda: NVIDIA_VISIBLE_DEVICES is not all (--device N counts every GPU)")
    if env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        ov.err(w, "backend cuda: CUDA_DEVICE_ORDER is not PCI_BUS_ID (--device N would not be "
                  "nvidia-smi's and the device plugin's index N)")
    if "compute" not in env.get("NVIDIA_DRIVER_CAPABILITIES", "").split(","):
        ov.err(w, "backend cuda: NVIDIA_DRIVER_CAPABILITIES lacks compute")
    n = d.device()
    if n is None:
        ov.err(w, f"--device {d.opts['device']!r} is not a number (unexpanded variable?)")
        return
    d.gpu = n
    if doc.get("kind") != "DaemonSet":
        return
    for field, other in all_containers(spec):
        res = other.get("resources") or {}
        for part in ("requests", "limits"):
            for r in res.get(part) or {}:
                if r.startswith("nvidia.com/"):
                    ov.err(w, f"container {other.get('name')} asks for {r}: the device plugin "
                              "would take a GPU from the engines")
    vol = d.socket_volume or {}
    path = (vol.get("hostPath") or {}).get("path")
    if path != f"/run/statepool/gpu{n}":
        ov.err(w, f"--device {n} but the socket's hostPath is {path} (want /run/statepool/gpu{n})")
    labels = d.meta.get("labels") or {}
    if labels.get("statepool/gpu") != str(n):
        ov.err(w, f"--device {n} but the pod label statepool/gpu is {labels.get('statepool/gpu')!r}")
    selector = (doc["spec"].get("selector") or {}).get("matchLabels") or {}
    if selector.get("statepool/gpu") != str(n):
        ov.err(w, f"--device {n} but the selector's statepool/gpu is {selector.get('statepool/gpu')!r}")
    terms = required_node_terms(spec)
    good = bool(terms) and all(
        any(e.get("key") == "nvidia.com/gpu.count" and e.get("operator") == "Gt"
            and e.get("values") == [str(n)] for e in t.get("matchExpressions") or [])
        for t in terms)
    if not good:
        ov.err(w, f"--device {n} but the node affinity is not nvidia.com/gpu.count Gt {n} in every term")
    if not any(t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists"
               for t in spec.get("tolerations") or []):
        ov.err(w, "no toleration for the nvidia.com/gpu taint")


def check_host_daemon(ov, d):
    w, spec, c, doc = d.where, d.spec, d.container, d.doc
    if spec.get("runtimeClassName"):
        ov.err(w, f"backend host with runtimeClassName {spec['runtimeClassName']}")
    if "NVIDIA_VISIBLE_DEVICES" in d.env:
        ov.err(w, "backend host with NVIDIA_VISIBLE_DEVICES")
    pool = parse_size(d.opts["pool-capacity"])
    staging = parse_size(d.opts["staging-capacity"])
    host_tier = parse_size(d.opts.get("snapshot-host-capacity", "0"))
    if None in (pool, staging, host_tier):
        ov.err(w, "a capacity is not a size (the host backend takes no fraction)")
        return
    limit = parse_quantity(((c.get("resources") or {}).get("limits") or {}).get("memory", "0")) or 0
    need = pool + staging + host_tier
    if limit < need:
        ov.err(w, f"memory limit {limit / 2**30:.2f} GiB is below --pool-capacity + "
                  f"--staging-capacity + --snapshot-host-capacity = {need / 2**30:.2f} GiB (memfd "
                  "shared memory is charged to the daemon's cgroup)")
    if doc.get("kind") == "DaemonSet":
        path = ((d.socket_volume or {}).get("hostPath") or {}).get("path")
        if path != "/run/statepool":
            ov.err(w, f"host-backend DaemonSet's socket hostPath is {path}, not /run/statepool")
        terms = required_node_terms(spec)
        good = bool(terms) and all(
            any(e.get("key") == "nvidia.com/gpu.count" and e.get("operator") == "DoesNotExist"
                for e in t.get("matchExpressions") or []) for t in terms)
        if not good:
            ov.err(w, "host-backend DaemonSet may land on GPU nodes (want nvidia.com/gpu.count "
                      "DoesNotExist in every required term)")


def check_daemonset_extras(ov, d):
    w, spec, doc = d.where, d.spec, d.doc
    strategy = doc["spec"].get("updateStrategy") or {}
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        rolling = strategy.get("rollingUpdate") or {}
        surge = rolling.get("maxSurge", 0)
        if surge not in (0, "0", "0%"):
            # Two daemons on one socket are the hand-over (docs/operations.md §12.3): the
            # new one must take the pool over, and the old one must wait for its deletion.
            if d.args.get("take-over") != "if-running":
                ov.err(w, f"maxSurge {surge} without --take-over=if-running: the second daemon "
                          "on the socket exits 1")
            if d.opts.get("after-handover") != "wait":
                ov.err(w, f"maxSurge {surge} without --after-handover=wait: the old daemon "
                          "exits after the hand-over and the kubelet restarts it")
            if rolling.get("maxUnavailable", 1) not in (0, "0", "0%"):
                ov.err(w, f"maxSurge {surge} with maxUnavailable "
                          f"{rolling.get('maxUnavailable', 1)}: the old pod may go before the "
                          "new one has taken its pool over")
        elif d.args.get("take-over") is not None and d.args.get("take-over") != "if-running":
            ov.err(w, "--take-over without =if-running: the node's first daemon exits 1")
    if d.socket_mount is not None:
        for field, c in all_containers(spec):
            if field == "initContainers" and c.get("name") in ROOT_ALLOWED:
                if not any(m["name"] == d.socket_mount["name"] for m in c.get("volumeMounts") or []):
                    ov.err(w, f"init container {c['name']} does not mount the socket volume")


def check_sidecar(ov, d):
    w, spec, c = d.where, d.spec, d.container
    if d.field != "initContainers" or c.get("restartPolicy") != "Always":
        ov.err(w, "statepoold is not a native sidecar (an init container with restartPolicy Always)")
    if not c.get("startupProbe"):
        ov.err(w, "the sidecar has no startupProbe: the engine would start before the socket listens")
    engines = [e for f, e in all_containers(spec) if f == "containers" and not is_daemon(e)]
    if not engines:
        ov.err(w, "the pod has no engine container")
    rel = None
    if d.socket_mount is not None:
        mp = d.socket_mount["mountPath"].rstrip("/")
        rel = d.opts["socket"][len(mp):]
    for e in engines:
        we = f"{ov.name}: {name_of(d.doc)} container {e.get('name')}"
        mounts = [m for m in e.get("volumeMounts") or []
                  if d.socket_mount is not None and m["name"] == d.socket_mount["name"]]
        if not mounts:
            ov.err(we, "does not mount the daemon's socket volume")
        elif rel is not None:
            want = mounts[0]["mountPath"].rstrip("/") + rel
            got = literal_env(e).get("STATEPOOL_SOCKET")
            if got != want:
                ov.err(we, f"STATEPOOL_SOCKET is {got!r}, the daemon's socket is at {want!r} here")
        uid = effective(e, spec, "runAsUser")
        if uid is not None and d.uid is not None and int(uid) == int(d.uid):
            ov.err(we, f"runs as the daemon's uid {uid}: the daemon treats it as an operator")
        gid = effective(e, spec, "runAsGroup")
        if d.tenants and uid is not None:
            if not any(int(uid) in t["uids"] or (gid is not None and int(gid) in t["gids"])
                       for t in d.tenants.values()):
                ov.err(we, f"uid {uid} (gid {gid}) is in no tenant's uids/gids of the daemon's config")
    for v in spec.get("volumes") or []:
        if "hostPath" in v:
            ov.err(w, f"volume {v['name']} is a hostPath: the sidecar needs none")
    if (spec.get("securityContext") or {}).get("seccompProfile", {}).get("type") != "RuntimeDefault":
        ov.err(w, "pod seccompProfile is not RuntimeDefault")


def check_service_monitoring(ov, ctx, daemons):
    services = [s for s in ov.of_kind("Service")
                if any(p.get("name") == "metrics" for p in s["spec"].get("ports") or [])]
    if len(services) != 1:
        ov.err(ov.name, f"{len(services)} Services with a port named metrics (want 1)")
        return
    svc = services[0]
    ws = f"{ov.name}: {name_of(svc)}"
    selector = svc["spec"].get("selector") or {}
    if not selector:
        ov.err(ws, "has no selector")
    svc_port = next(p for p in svc["spec"]["ports"] if p.get("name") == "metrics")
    daemon_docs = {id(d.doc) for d in daemons}
    for doc, meta, spec in ov.workloads():
        labels = meta.get("labels") or {}
        selected = selector and all(labels.get(k) == v for k, v in selector.items())
        if selected and id(doc) not in daemon_docs:
            ov.err(ws, f"selects {name_of(doc)}, which runs no statepoold")
    for d in daemons:
        labels = d.meta.get("labels") or {}
        if not all(labels.get(k) == v for k, v in selector.items()):
            ov.err(ws, f"does not select {name_of(d.doc)}'s pods (labels {labels})")
        target = svc_port.get("targetPort", svc_port.get("port"))
        if d.metrics_port is not None and resolve_port(d.container, target) != d.metrics_port:
            ov.err(ws, f"targetPort {target!r} is not {name_of(d.doc)}'s metrics port {d.metrics_port}")
    monitors = ov.of_kind("ServiceMonitor")
    if len(monitors) != 1:
        ov.err(ov.name, f"{len(monitors)} ServiceMonitors (want 1)")
        return
    sm = monitors[0]
    wm = f"{ov.name}: {name_of(sm)}"
    match = (sm["spec"].get("selector") or {}).get("matchLabels") or {}
    svc_labels = svc["metadata"].get("labels") or {}
    if not match or not all(svc_labels.get(k) == v for k, v in match.items()):
        ov.err(wm, f"selector {match} does not select Service {svc['metadata']['name']}")
    if sm["metadata"].get("namespace") != svc["metadata"].get("namespace") and \
            not sm["spec"].get("namespaceSelector"):
        ov.err(wm, "is in another namespace than the Service and has no namespaceSelector")
    endpoints = sm["spec"].get("endpoints") or []
    if not endpoints:
        ov.err(wm, "has no endpoints")
    for ep in endpoints:
        if ep.get("port") != svc_port.get("name"):
            ov.err(wm, f"endpoint port {ep.get('port')!r} is not the Service's port name "
                       f"{svc_port.get('name')!r}")
        if ep.get("path", "/metrics") != "/metrics":
            ov.err(wm, f"endpoint path {ep.get('path')!r} is not /metrics")


def check_charts(ov, ctx):
    rules = ov.of_kind("PrometheusRule")
    if len(rules) != 1:
        ov.err(ov.name, f"{len(rules)} PrometheusRules (want 1)")
    for r in rules:
        spec = r.get("spec") or {}
        if set(spec) != {"groups"} or spec["groups"] != ctx.rule_groups:
            ov.err(f"{ov.name}: {name_of(r)}",
                   "spec.groups differ from charts/prometheus/statepool-rules.yaml's groups "
                   "(run deploy/kubernetes/generate.py)")
    dashboards = [c for c in ov.of_kind("ConfigMap")
                  if (c["metadata"].get("labels") or {}).get("grafana_dashboard") == "1"]
    if len(dashboards) != 1:
        ov.err(ov.name, f"{len(dashboards)} ConfigMaps labelled grafana_dashboard: \"1\" (want 1)")
    for cm in dashboards:
        wd = f"{ov.name}: {name_of(cm)}"
        data = cm.get("data") or {}
        if set(data) != {ctx.dashboard_path.name} or cm.get("binaryData"):
            ov.err(wd, f"keys {sorted(data)}; want exactly {ctx.dashboard_path.name}")
            continue
        if data[ctx.dashboard_path.name].encode("utf-8") != ctx.dashboard_bytes:
            ov.err(wd, "the dashboard is not byte-equal to charts/grafana/statepool-dashboard.json "
                       "(run deploy/kubernetes/generate.py)")
        else:
            json.loads(data[ctx.dashboard_path.name])


def check_namespaces(ov):
    namespaces = ov.of_kind("Namespace")
    kind = ov.expect.get("kind")
    release = ov.expect.get("release_namespace")
    if release is not None:
        # A Helm release: the namespace exists before the release (Helm stores the release
        # there), so the chart brings no Namespace object and puts everything in it.
        if namespaces:
            ov.err(ov.name, "has a Namespace object: a chart installs into the release's namespace")
        for d in ov.docs:
            if d["metadata"].get("namespace") != release:
                ov.err(ov.name, f"{name_of(d)} is not in the release namespace {release}")
    elif kind in ("gpu", "cpu"):
        if len(namespaces) != 1:
            ov.err(ov.name, f"{len(namespaces)} Namespace objects (want 1)")
            return
        ns = namespaces[0]["metadata"]
        level = (ns.get("labels") or {}).get("pod-security.kubernetes.io/enforce")
        if level != "privileged":
            ov.err(ov.name, f"Namespace {ns['name']} enforces Pod Security {level!r}: hostPath and "
                            "the root chown init container need privileged")
        for d in ov.docs:
            if d.get("kind") != "Namespace" and d["metadata"].get("namespace") != ns["name"]:
                ov.err(ov.name, f"{name_of(d)} is not in namespace {ns['name']}")
    elif namespaces:
        ov.err(ov.name, "has a Namespace object: it deploys into the engines' namespace")


def check_overlay_shape(ov, ctx, daemons):
    kind = ov.expect["kind"]
    cuda = [d for d in daemons if d.backend == "cuda"]
    host = [d for d in daemons if d.backend == "host"]
    daemonsets = [d for d in daemons if d.doc["kind"] == "DaemonSet"]
    if kind == "gpu":
        devices = sorted(getattr(d, "gpu", -1) for d in cuda)
        want = sorted(ov.expect.get("gpus", range(ctx.gpus)))
        if devices != want:
            ov.err(ov.name, f"cuda daemons for devices {devices}; want {want} once each")
        if host or len(daemonsets) != len(daemons):
            ov.err(ov.name, "has daemons that are not per-GPU DaemonSets")
        for d in cuda:
            want = f"statepoold-gpu{getattr(d, 'gpu', '?')}"
            if d.doc["metadata"]["name"] != want:
                ov.err(ov.name, f"{name_of(d.doc)} serves GPU {getattr(d, 'gpu', '?')}: name it {want}")
    elif kind == "cpu":
        if len(host) != 1 or cuda or len(daemonsets) != 1:
            ov.err(ov.name, f"want one host-backend DaemonSet, found {[name_of(d.doc) for d in daemons]}")
    elif kind == "sidecar":
        if len(daemons) != 1 or daemonsets:
            ov.err(ov.name, f"want one sidecar daemon, found {[name_of(d.doc) for d in daemons]}")


def check_example(ov, ctx, served):
    """An engine that uses the node daemons of the overlay it names."""
    gpu_daemons = [d for d in getattr(served, "checked_daemons", []) if d.backend == "cuda"]
    if not gpu_daemons:
        ov.err(ov.name, f"overlay {served.name} has no cuda daemons to serve it")
        return
    daemon_dirs = {((d.socket_volume or {}).get("hostPath") or {}).get("path") for d in gpu_daemons}
    socket_names = {d.opts["socket"].rsplit("/", 1)[-1] for d in gpu_daemons}
    groups = {d.gid for d in gpu_daemons}
    workloads = list(ov.workloads())
    if not workloads:
        ov.err(ov.name, "has no workload")
    for doc, meta, spec in workloads:
        w = f"{ov.name}: {name_of(doc)}"
        check_host_namespaces(ov, doc, meta, spec)
        supplemental = set((spec.get("securityContext") or {}).get("supplementalGroups") or [])
        for field, c in all_containers(spec):
            if is_daemon(c):
                continue
            wc = f"{w} container {c.get('name')}"
            if not (groups <= supplemental or effective(c, spec, "runAsGroup") in groups):
                ov.err(wc, f"is not in the daemons' group {sorted(g for g in groups if g is not None)} "
                           "(supplementalGroups): the socket is 0660")
            limits = (c.get("resources") or {}).get("limits") or {}
            if int(limits.get("nvidia.com/gpu", 0)) < 1:
                ov.err(wc, "asks for no nvidia.com/gpu: it learns its daemon from its GPU")
            found = False
            for m in c.get("volumeMounts") or []:
                vol = volume(spec, m["name"]) or {}
                host = (vol.get("hostPath") or {}).get("path")
                if not host:
                    continue
                host = host.rstrip("/")
                if all(p and (p + "/").startswith(host + "/") for p in daemon_dirs):
                    found = True
                    prefix = m["mountPath"].rstrip("/")
                    for name in socket_names:
                        want = f"{prefix}/gpu${{NVIDIA_VISIBLE_DEVICES}}/{name}"
                        text = " ".join((c.get("command") or []) + (c.get("args") or []))
                        if want not in text:
                            ov.err(wc, f"does not name its GPU's socket {want}")
            if not found:
                ov.err(wc, f"mounts no hostPath that holds every daemon's directory "
                           f"{sorted(map(str, daemon_dirs))}")


def check_overlay(ov, ctx):
    for doc in ov.docs:
        if not doc.get("apiVersion") or not doc.get("kind") or not (doc.get("metadata") or {}).get("name"):
            ov.err(ov.name, f"object without apiVersion, kind or name: {str(doc)[:80]}")
    for doc, meta, spec in ov.workloads():
        check_containers(ov, doc, meta, spec)
        check_volumes(ov, doc, meta, spec)
        check_host_namespaces(ov, doc, meta, spec)
    daemons = ov.daemons()
    for d in daemons:
        check_daemon(ov, ctx, d)
        if d.doc["kind"] == "DaemonSet":
            check_daemonset_extras(ov, d)
        else:
            check_sidecar(ov, d)
    check_service_monitoring(ov, ctx, daemons)
    check_charts(ov, ctx)
    check_namespaces(ov)
    check_overlay_shape(ov, ctx, daemons)
    ov.checked_daemons = daemons
    return daemons


def run_checks(overlays, examples, ctx):
    """All checks; returns the error messages."""
    errors = []
    for ov in overlays.values():
        ov.errors = []
        check_overlay(ov, ctx)
        errors += ov.errors
    for ex in examples.values():
        ex.errors = []
        for doc, meta, spec in ex.workloads():
            check_containers(ex, doc, meta, spec)
            check_volumes(ex, doc, meta, spec)
        served = overlays.get(ex.expect["serves"])
        if served is None:
            ex.err(ex.name, f"serves overlay {ex.expect['serves']}, which is missing")
        else:
            check_example(ex, ctx, served)
        errors += ex.errors
    return errors


# ---------------------------------------------------------------------------------------
# statepoold --print-config on each daemon's command line.

def validate_flags(overlays, ctx):
    errors = []
    binary = ctx.statepoold
    if not binary:
        return errors
    if not os.access(binary, os.X_OK):
        ctx.notes.append(f"note: {binary} is not built; daemon flags not run through --print-config")
        return errors
    cuda_missing, ran = False, 0
    with tempfile.TemporaryDirectory() as tmp:
        for ov in overlays.values():
            for i, d in enumerate(ov.daemons()):
                argv = []
                for key, value in d.args.items():
                    if SECRET_MARK in value:
                        if key not in SECRET_STAND_INS:
                            errors.append(f"{d.where}: --{key} from a Secret has no stand-in "
                                          "for --print-config (SECRET_STAND_INS)")
                            continue
                        value = SECRET_STAND_INS[key]
                    if key == "plan-dir":  # the pod's mounted ConfigMap: an empty stand-in
                        value = os.path.join(tmp, "plans")
                        os.makedirs(value, exist_ok=True)
                    if key == "config" and d.config_text is not None:
                        path = os.path.join(tmp, f"{len(os.listdir(tmp))}.conf")
                        with open(path, "w", encoding="utf-8") as f:
                            f.write(d.config_text)
                        value = path
                    argv.append(f"--{key}={value}")
                run = subprocess.run([binary, *argv, "--print-config"], capture_output=True,
                                     text=True, timeout=60)
                if run.returncode == 2 and "built without CUDA" in run.stderr:
                    cuda_missing = True
                    continue
                ran += 1
                if run.returncode != 0:
                    errors.append(f"{d.where}: statepoold --print-config exits {run.returncode}: "
                                  f"{run.stderr.strip()}")
    ctx.notes.append(f"{ran} daemons' command lines run through {binary} --print-config")
    if cuda_missing:
        ctx.notes.append("note: this statepoold has no CUDA; cuda daemons' flags not run")
    return errors


# ---------------------------------------------------------------------------------------
# Self-test: every breakage below must be caught.

def _daemonset(ov, name):
    return next(d for d in ov.docs if d.get("kind") == "DaemonSet" and d["metadata"]["name"] == name)


def _container(doc, name, field="containers"):
    return next(c for c in pod_template(doc)[1][field] if c["name"] == name)


def _deployment(ov):
    return next(d for d in ov.docs if d.get("kind") == "Deployment")


def _set_arg(container, flag, value):
    args = container["args"]
    for i, a in enumerate(args):
        if a.startswith(f"--{flag}="):
            args[i] = f"--{flag}={value}"
            return
    args.append(f"--{flag}={value}")


def _rule_expr(ov):
    rule = ov.of_kind("PrometheusRule")[0]
    rule["spec"]["groups"][0]["rules"][0]["expr"] += " * 2"


def _dashboard(ov):
    cm = next(c for c in ov.of_kind("ConfigMap") if (c["metadata"].get("labels") or {}).get("grafana_dashboard"))
    key = next(iter(cm["data"]))
    cm["data"][key] = cm["data"][key].replace("{", "{ ", 1)


MUTATIONS = [
    ("liveness probe on the API port", "gpu",
     lambda ov: _container(_daemonset(ov, "statepoold-gpu2"), "statepoold")["livenessProbe"]["httpGet"].update(port=9465),
     "livenessProbe port"),
    ("metrics on loopback", "cpu",
     lambda ov: _set_arg(_container(_daemonset(ov, "statepoold-host"), "statepoold"), "metrics-address", "127.0.0.1:9464"),
     "loopback"),
    ("containerPort renamed", "cpu",
     lambda ov: _container(_daemonset(ov, "statepoold-host"), "statepoold")["ports"][0].update(name="prom"),
     "containerPort named metrics"),
    ("socket outside every mount", "cpu",
     lambda ov: _set_arg(_container(_daemonset(ov, "statepoold-host"), "statepoold"), "socket", "/tmp/statepool.sock"),
     "in no volume mount"),
    ("socket volume unmounted by the daemon", "gpu",
     lambda ov: _container(_daemonset(ov, "statepoold-gpu0"), "statepoold")["volumeMounts"].pop(0),
     "in no volume mount"),
    ("a volume nobody mounts", "sidecar",
     lambda ov: pod_template(_deployment(ov))[1]["volumes"].append({"name": "spare", "emptyDir": {}}),
     "not mounted"),
    ("grace period below the drain timeout", "gpu",
     lambda ov: pod_template(_daemonset(ov, "statepoold-gpu5"))[1].update(terminationGracePeriodSeconds=20),
     "terminationGracePeriodSeconds"),
    ("drain timeout raised past the grace period", "sidecar",
     lambda ov: _set_arg(_container(_deployment(ov), "statepoold", "initContainers"), "drain-timeout", "1m"),
     "terminationGracePeriodSeconds"),
    ("gpu3 serves the hostPath of gpu4", "gpu",
     lambda ov: pod_template(_daemonset(ov, "statepoold-gpu3"))[1]["volumes"][0]["hostPath"].update(path="/run/statepool/gpu4"),
     "hostPath is /run/statepool/gpu4"),
    ("gpu6 scheduled on nodes with more than 5 GPUs", "gpu",
     lambda ov: required_node_terms(pod_template(_daemonset(ov, "statepoold-gpu6"))[1])[0]["matchExpressions"][0].update(values=["5"]),
     "node affinity"),
    ("a DaemonSet asks for a GPU", "gpu",
     lambda ov: _container(_daemonset(ov, "statepoold-gpu1"), "statepoold")["resources"]["limits"].update({"nvidia.com/gpu": 1}),
     "nvidia.com/gpu"),
    ("CUDA's default device order", "gpu-legacy-ipc",
     lambda ov: [e.update(value="FASTEST_FIRST") for e in _container(_daemonset(ov, "statepoold-gpu0"), "statepoold")["env"]
                 if e["name"] == "CUDA_DEVICE_ORDER"],
     "CUDA_DEVICE_ORDER"),
    ("hostIPC outside the legacy overlay", "gpu",
     lambda ov: pod_template(_daemonset(ov, "statepoold-gpu0"))[1].update(hostIPC=True),
     "hostIPC is true"),
    ("legacy overlay without hostPID", "gpu-legacy-ipc",
     lambda ov: pod_template(_daemonset(ov, "statepoold-gpu7"))[1].pop("hostPID"),
     "hostPID is not true"),
    ("an args variable without its env entry", "cpu",
     lambda ov: _container(_daemonset(ov, "statepoold-host"), "statepoold")["env"].pop(1),
     "not in the container's env"),
    ("init container without resources", "cpu",
     lambda ov: _container(_daemonset(ov, "statepoold-host"), "socket-dir", "initContainers").pop("resources"),
     "no resources.requests.cpu"),
    ("daemon as root", "cpu",
     lambda ov: _container(_daemonset(ov, "statepoold-host"), "statepoold")["securityContext"].update(runAsUser=0),
     "non-root uid"),
    ("engine as root", "sidecar",
     lambda ov: _container(_deployment(ov), "engine")["securityContext"].update(runAsUser=0),
     "non-root uid"),
    ("engine uid not in any tenant", "sidecar",
     lambda ov: _container(_deployment(ov), "engine")["securityContext"].update(runAsUser=1002, runAsGroup=1002),
     "in no tenant"),
    ("engine as the daemon's uid", "sidecar",
     lambda ov: _container(_deployment(ov), "engine")["securityContext"].update(runAsUser=65532),
     "daemon's uid"),
    ("engine without the socket volume", "sidecar",
     lambda ov: _container(_deployment(ov), "engine").pop("volumeMounts"),
     "does not mount the daemon's socket volume"),
    ("sidecar as a plain container", "sidecar",
     lambda ov: _container(_deployment(ov), "statepoold", "initContainers").pop("restartPolicy"),
     "native sidecar"),
    ("fsGroup not the daemon's group", "sidecar",
     lambda ov: pod_template(_deployment(ov))[1]["securityContext"].update(fsGroup=2000),
     "fsGroup"),
    ("host-backend memory limit below the pool", "cpu",
     lambda ov: _container(_daemonset(ov, "statepoold-host"), "statepoold")["resources"]["limits"].update(memory="4Gi"),
     "memory limit"),
    ("more workers than CPUs", "cpu",
     lambda ov: _set_arg(_container(_daemonset(ov, "statepoold-host"), "statepoold"), "workers", "16"),
     "--workers 16"),
    ("Service targets another port name", "gpu",
     lambda ov: ov.of_kind("Service")[0]["spec"]["ports"][0].update(targetPort="http"),
     "targetPort"),
    ("ServiceMonitor scrapes another port", "sidecar",
     lambda ov: ov.of_kind("ServiceMonitor")[0]["spec"]["endpoints"][0].update(port="web"),
     "endpoint port"),
    ("a rule edited", "cpu", _rule_expr, "spec.groups differ"),
    ("the dashboard edited", "gpu", _dashboard, "byte-equal"),
    ("an image from a registry host", "sidecar",
     lambda ov: _container(_deployment(ov), "engine").update(image="registry.example:5000/engine:1"),
     "registry host"),
    ("the cuda daemon on the host image", "gpu",
     lambda ov: _container(_daemonset(ov, "statepoold-gpu4"), "statepoold").update(image="statepool:0.1.0"),
     "CUDA variant"),
    ("API off loopback without a token", "cpu",
     lambda ov: _set_arg(_container(_daemonset(ov, "statepoold-host"), "statepoold"), "api-address", "0.0.0.0:9465"),
     "api-token-file"),
    ("a rolling hand-over without --take-over", "cpu",
     lambda ov: _container(_daemonset(ov, "statepoold-host"), "statepoold")["args"].remove("--take-over=if-running"),
     "without --take-over=if-running"),
    ("a rolling hand-over whose old daemon exits", "gpu",
     lambda ov: _set_arg(_container(_daemonset(ov, "statepoold-gpu2"), "statepoold"), "after-handover", "exit"),
     "without --after-handover=wait"),
    ("a rolling hand-over that may leave a node without a daemon", "cpu",
     lambda ov: _daemonset(ov, "statepoold-host")["spec"]["updateStrategy"]["rollingUpdate"].update(maxUnavailable=1),
     "with maxUnavailable 1"),
    ("a flag given twice", "gpu",
     lambda ov: _container(_daemonset(ov, "statepoold-gpu0"), "statepoold")["args"].append("--backend=cuda"),
     "given twice"),
    ("the GPU engine outside the daemons' group", "engine-gpu",
     lambda ov: pod_template(_deployment(ov))[1]["securityContext"].pop("supplementalGroups"),
     "daemons' group"),
]


def selftest(overlays, examples, ctx):
    failures = []
    base = run_checks(overlays, examples, ctx)
    if base:
        failures.append("the unmodified manifests fail:\n  " + "\n  ".join(base))
    for title, target, mutate, expected in MUTATIONS:
        ovs = {k: Overlay(v.name, copy.deepcopy(v.docs), v.expect) for k, v in overlays.items()}
        exs = {k: Overlay(v.name, copy.deepcopy(v.docs), v.expect) for k, v in examples.items()}
        mutate(ovs[target] if target in ovs else exs[target])
        try:
            errors = run_checks(ovs, exs, ctx)
        except Exception as e:  # a crash is no clear message: the checks must say what broke
            failures.append(f"the checks crash on: {title} ({target}): {e!r}")
            continue
        if not any(expected.lower() in e.lower() for e in errors):
            failures.append(f"not caught: {title} ({target}); expected an error with {expected!r}, "
                            f"got: {errors[:3]}")
        else:
            print(f"caught: {title}: {next(e for e in errors if expected.lower() in e.lower())}")
    return failures


# ---------------------------------------------------------------------------------------

def kubectl_version(kubectl):
    run = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True,
                         text=True, timeout=60)
    if run.returncode != 0:
        raise RuntimeError(f"{kubectl} version --client failed: {run.stderr.strip()}")
    client = json.loads(run.stdout)["clientVersion"]
    major = int(re.match(r"\d+", client["major"]).group(0))
    minor = int(re.match(r"\d+", client["minor"]).group(0))
    return major, minor, client.get("gitVersion", ""), json.loads(run.stdout).get("kustomizeVersion", "")


def render(kubectl, path):
    run = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                         timeout=120)
    if run.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {path} failed:\n{run.stderr.strip()}")
    return [d for d in yaml.safe_load_all(run.stdout) if d is not None]


def load_gpus(deploy):
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    spec = importlib.util.spec_from_file_location("statepool_k8s_generate", deploy / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GPUS


def report(rendered, ctx, errors):
    """Prints what each rendering holds, the notes and the verdict; the exit status."""
    for ov in rendered:
        kinds = {}
        for d in ov.docs:
            kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
        print(f"{ov.name}: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    for note in ctx.notes:
        print(note)
    if errors:
        print(f"FAILED: {len(errors)} problems")
        print("\n".join(errors))
        return 1
    print("all invariants hold")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubectl", default="/usr/bin/kubectl")
    parser.add_argument("--deploy", type=pathlib.Path, required=True, help="deploy/kubernetes")
    parser.add_argument("--charts", type=pathlib.Path, required=True, help="charts/")
    parser.add_argument("--statepoold", help="run each daemon's flags through --print-config")
    parser.add_argument("--selftest", action="store_true",
                        help="check that deliberate breakages are caught")
    args = parser.parse_args()

    if not (os.path.isfile(args.kubectl) and os.access(args.kubectl, os.X_OK)):
        print(f"SKIPPED: kubectl is not installed at {args.kubectl} (set STATEPOOL_KUBECTL, or "
              f"install kubectl >= {MIN_KUBECTL[0]}.{MIN_KUBECTL[1]}); the manifests were not rendered")
        return SKIP
    major, minor, git_version, kustomize = kubectl_version(args.kubectl)
    if (major, minor) < MIN_KUBECTL:
        print(f"SKIPPED: {args.kubectl} is {git_version}; deploy/kubernetes needs kubectl >= "
              f"{MIN_KUBECTL[0]}.{MIN_KUBECTL[1]} (its embedded Kustomize has no components or "
              "inline patches before that; Debian 12's kubernetes-client is 1.20)")
        return SKIP
    print(f"kubectl {git_version}, kustomize {kustomize or '(embedded)'}")

    ctx = Context(args.charts, load_gpus(args.deploy), args.statepoold)
    overlays, examples, errors = {}, {}, []
    found = sorted(p.parent.name for p in (args.deploy / "overlays").glob("*/kustomization.yaml"))
    for name in sorted(set(found) | set(OVERLAYS)):
        if name not in found:
            errors.append(f"overlay {name} is missing (deploy/kubernetes/overlays/{name})")
            continue
        if name not in OVERLAYS:
            errors.append(f"overlay {name} is not in check_kustomize.py's OVERLAYS: say what it must be")
            continue
        overlays[name] = Overlay(name, render(args.kubectl, args.deploy / "overlays" / name), OVERLAYS[name])
    found = sorted(p.parent.name for p in (args.deploy / "examples").glob("*/kustomization.yaml"))
    for name in sorted(set(found) | set(EXAMPLES)):
        if name not in found or name not in EXAMPLES:
            errors.append(f"example {name}: missing, or not in check_kustomize.py's EXAMPLES")
            continue
        examples[name] = Overlay(f"examples/{name}", render(args.kubectl, args.deploy / "examples" / name),
                                 dict(EXAMPLES[name], kind="example"))

    if args.selftest:
        failures = errors + selftest(overlays, examples, ctx)
        if failures:
            print("FAILED:\n" + "\n".join(failures))
            return 1
        print(f"selftest: all {len(MUTATIONS)} breakages caught")
        return 0

    errors += run_checks(overlays, examples, ctx)
    errors += validate_flags(overlays, ctx)
    return report(list(overlays.values()) + list(examples.values()), ctx, errors)


if __name__ == "__main__":
    sys.exit(main())
