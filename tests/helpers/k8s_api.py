"""A Kubernetes API server as label_nodes.py meets it, on a local port: the node calls it makes, and nodes as
the server holds them."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any


class FakeApi:
    """The two node calls label_nodes.py makes, as the API server answers them: GET, and a JSON merge patch
    that must carry the node's current resourceVersion (else 409). ``conflicts`` patches fail first, as when
    the kubelet updates the node meanwhile; ``status`` answers every call (403: no RBAC)."""

    def __init__(self, nodes: dict[str, dict[str, Any]], conflicts: int = 0, status: int = 0) -> None:
        self.nodes, self.conflicts, self.status, self.patches = nodes, conflicts, status, []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802  (http.server's name)
                name = self.path.rsplit("/", 1)[-1]
                if api.status:
                    return self._answer(api.status, {"reason": "Forbidden"})
                if name not in api.nodes:
                    return self._answer(404, {"reason": "NotFound"})
                self._answer(200, api.nodes[name])

            def do_PATCH(self) -> None:  # noqa: N802
                name = self.path.rsplit("/", 1)[-1]
                assert self.headers["Content-Type"] == "application/merge-patch+json"
                assert self.headers["Authorization"] == "Bearer t0ken"
                patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.patches.append((name, patch))
                node = api.nodes[name]
                if api.conflicts:
                    api.conflicts -= 1
                    node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                if patch["metadata"].pop("resourceVersion") != node["metadata"]["resourceVersion"]:
                    return self._answer(409, {"reason": "Conflict"})
                for field in ("labels", "annotations"):
                    current = node["metadata"].setdefault(field, {})
                    for k, v in patch["metadata"].get(field, {}).items():
                        if v is None:
                            current.pop(k, None)
                        else:
                            current[k] = v
                node["spec"]["taints"] = patch["spec"]["taints"]
                node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                self._answer(200, node)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def k8s_node(name: str, taints: list[dict[str, str]], **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "7", "labels": {"kubernetes.io/hostname": name},
                         "annotations": annotations}, "spec": {"taints": taints}}
