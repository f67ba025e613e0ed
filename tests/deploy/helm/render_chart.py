"""Renders and lints the statepool chart with Helm's own engine, in the venv of
scripts/helm-venv (helm-sdkpy: Helm as a shared library). Not a renderer of ours: Helm's
install action runs against fake_apiserver's stand-in of the Kubernetes API on 127.0.0.1
with the release kept in memory (HELM_DRIVER=memory), so that the manifests it renders,
schema validation and NOTES.txt included, are what `helm install` would send; helm-sdkpy
has no `helm template` call.

  HELM_DRIVER=memory python render_chart.py CHART CASES.json OUT.json

CASES.json: {"case name": {"values": {...} or null, "namespace": "ns", "without": [API
group/versions the cluster does not serve]}}. OUT.json: per case
{"manifest": text, "notes": text} or {"error": message}, and "lint": Helm's lint result of
the chart with its own values.
"""

import asyncio
import json
import os
import sys
import tempfile

import fake_apiserver


def main() -> int:
    chart, cases_path, out_path = sys.argv[1:4]
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    # Helm's release storage: this process's memory. Helm's Go runtime copies the
    # environment when the library loads, so the caller sets it (check_helm.py does).
    if os.environ.get("HELM_DRIVER") != "memory":
        sys.exit("render_chart.py: run with HELM_DRIVER=memory")
    import helm_sdkpy

    out = {}
    with fake_apiserver.serve() as server, tempfile.TemporaryDirectory() as tmp:
        for name, case in cases.items():
            namespace = case.get("namespace", "statepool")
            for group_version in case.get("without", []):
                server.without(group_version)
            kubeconfig = os.path.join(tmp, "kubeconfig")
            server.write_kubeconfig(kubeconfig, namespace)
            config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig)
            release = "statepool"
            try:
                result = asyncio.run(helm_sdkpy.Install(config).run(
                    release, chart, values=case.get("values"), wait=False, timeout=60))
                out[name] = {"manifest": result.get("manifest", ""),
                             "notes": (result.get("info") or {}).get("notes", "")}
                asyncio.run(helm_sdkpy.Uninstall(config).run(release, wait=False, timeout=60))
            except helm_sdkpy.HelmError as e:
                out[name] = {"error": str(e)}
            server.reset()
        server.write_kubeconfig(os.path.join(tmp, "kubeconfig"), "default")
        config = helm_sdkpy.Configuration(namespace="default",
                                          kubeconfig=os.path.join(tmp, "kubeconfig"))
        out["lint"] = asyncio.run(helm_sdkpy.Lint(config).run(chart))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
