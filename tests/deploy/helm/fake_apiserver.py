"""A stand-in for the Kubernetes API server, just enough for Helm's install and uninstall
actions (discovery, then a GET and a POST or DELETE per object), on 127.0.0.1. It keeps the
objects it is sent and validates nothing: the checks are check_helm.py's. Standard library
only (it runs in the helm venv).
"""

import contextlib
import http.server
import json
import threading
import urllib.parse

# The kinds the chart renders, by group/version: (resource, kind, namespaced).
RESOURCES = {
    "v1": [("configmaps", "ConfigMap", True), ("secrets", "Secret", True),
           ("services", "Service", True), ("namespaces", "Namespace", False)],
    "apps/v1": [("daemonsets", "DaemonSet", True), ("deployments", "Deployment", True)],
    "monitoring.coreos.com/v1": [("servicemonitors", "ServiceMonitor", True),
                                 ("prometheusrules", "PrometheusRule", True)],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


class _Handler(http.server.BaseHTTPRequestHandler):
    store: dict  # path -> object, set on the server's handler class
    served: dict  # the group/versions served (RESOURCES, or part of it)

    def log_message(self, *args):  # quiet
        pass

    def _send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _not_found(self):
        self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "reason": "NotFound", "code": 404, "message": "not found"})

    def _path(self):
        return urllib.parse.urlparse(self.path).path.rstrip("/")

    def do_GET(self):
        path = self._path()
        if path == "/version":
            return self._send(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0"})
        if path == "/api":
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            groups = [{"name": gv.split("/")[0],
                       "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                       "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}}
                      for gv in self.served if "/" in gv]
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        for prefix in ("/api/", "/apis/"):
            gv = path[len(prefix):] if path.startswith(prefix) else None
            if gv in self.served:
                return self._send(200, {
                    "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                    "resources": [{"name": r, "singularName": k.lower(), "namespaced": ns,
                                   "kind": k, "verbs": VERBS} for r, k, ns in self.served[gv]]})
        if path in self.store:
            return self._send(200, self.store[path])
        return self._not_found()

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def do_POST(self):
        obj = self._body()
        meta = obj.setdefault("metadata", {})
        meta.update(uid=f"uid-{len(self.store)}", resourceVersion="1")
        self.store[f"{self._path()}/{meta.get('name')}"] = obj
        self._send(201, obj)

    def do_PUT(self):
        obj = self._body()
        self.store[self._path()] = obj
        self._send(200, obj)

    def do_DELETE(self):
        obj = self.store.pop(self._path(), None)
        if obj is None:
            return self._not_found()
        self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


class Server:
    def __init__(self):
        handler = type("Handler", (_Handler,), {"store": {}, "served": dict(RESOURCES)})
        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._handler = handler
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def reset(self):
        self._handler.store.clear()
        self._handler.served = dict(RESOURCES)

    def without(self, group_version):
        """Stops serving an API group/version (a cluster without that CRD)."""
        self._handler.served.pop(group_version, None)

    def write_kubeconfig(self, path, namespace):
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "fake",
                       "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                       "users": [{"name": "test", "user": {"token": "test"}}],
                       "contexts": [{"name": "fake", "context": {
                           "cluster": "fake", "user": "test", "namespace": namespace}}]}, f)

    def close(self):
        self._http.shutdown()
        self._http.server_close()


@contextlib.contextmanager
def serve():
    server = Server()
    try:
        yield server
    finally:
        server.close()
