"""Put the merge's result on the Kubernetes nodes, where operators look (render.sh, CG_LABEL_NODES=1).

    python3 launch/k8s/label_nodes.py /reports/RUN --run RUN [--dry-run]

Reads the merge's RUN/accepted-hosts.txt and RUN/excluded-hosts.txt (``HOST<TAB>reason<TAB>action``) and
patches each node:

- every node: labels ``clustergate.io/verdict=accept|excluded`` and ``clustergate.io/run=RUN``;
- an excluded node: annotations ``clustergate.io/reason`` (the merge's reason) and ``clustergate.io/action``
  (what to do: isolate, reset, config, retest or vendor) and the taint ``clustergate.io/excluded=RUN:NoSchedule``,
  so nothing new is scheduled there (``kubectl get nodes -L clustergate.io/verdict``, ``kubectl describe node``);
- an accepted node: those annotations and that taint removed, where an earlier run left them.

Nothing else on a node changes: other labels and taints stay. Each patch carries the resourceVersion
it was computed from; a node changed meanwhile is read and patched again. It runs in the merge Job's
pod with the ServiceAccount of label-nodes-rbac.yaml (get and patch nodes), in-cluster: the API server
from KUBERNETES_SERVICE_HOST/PORT, the token and CA from the mounted service-account directory.
Standard library only. Exit status 0 when every node was patched (a listed host that is no Kubernetes node
is named and skipped), 1 when some node could not be patched (each named), 2 when the host lists cannot
be read.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

VERDICT, RUN, REASON, ACTION, TAINT = ("clustergate.io/verdict", "clustergate.io/run", "clustergate.io/reason",
                                       "clustergate.io/action", "clustergate.io/excluded")
ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REASON_CHARS = 1000


def read_hosts(run_dir: Path) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(accepted hosts, {excluded host: reason}, {excluded host: action}) from the merge's host lists (a list
    written before merge named actions has no third column)."""
    accepted = (run_dir / "accepted-hosts.txt").read_text().split()
    excluded: dict[str, str] = {}
    actions: dict[str, str] = {}
    for line in (run_dir / "excluded-hosts.txt").read_text().splitlines():
        host, _, rest = line.partition("\t")
        reason, _, action = rest.partition("\t")
        if host.strip():
            excluded[host.strip()] = reason.strip()
            actions[host.strip()] = action.strip()
    return accepted, excluded, actions


def patch_for(node: dict[str, Any], run: str, reason: str | None, action: str = "") -> dict[str, Any]:
    """The merge patch that marks ``node`` (the object as read) accepted (``reason`` None) or excluded."""
    taints = [t for t in node.get("spec", {}).get("taints") or [] if t.get("key") != TAINT]
    annotations: dict[str, str | None] = {REASON: None, ACTION: None}
    if reason is not None:
        taints.append({"key": TAINT, "value": run, "effect": "NoSchedule"})
        annotations[REASON] = reason[:REASON_CHARS] or "excluded by the merge"
        annotations[ACTION] = action or None
    return {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"],
                         "labels": {VERDICT: "excluded" if reason is not None else "accept", RUN: run},
                         "annotations": annotations},
            # A merge patch replaces a list whole: the node's other taints are written back as they were.
            "spec": {"taints": taints}}


class Api:
    """The few calls needed, against the API server, with the pod's service-account token."""

    def __init__(self, base: str, token: str, ca_file: str | None) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=ca_file) if base.startswith("https") else None

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/merge-patch+json")
        with urllib.request.urlopen(req, timeout=30, context=self.context) as resp:
            return json.loads(resp.read())

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/nodes/{name}")

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", f"/api/v1/nodes/{name}", patch)


MISSING = "no such Kubernetes node"


def mark(api: Api, name: str, run: str, reason: str | None, attempts: int = 5, action: str = "") -> str:
    """Patch one node; '' when done, else why not (starting with MISSING where the node does not exist)."""
    return apply(api, name, lambda node: patch_for(node, run, reason, action), attempts)


def apply(api: Api, name: str, build: Callable[[dict[str, Any]], dict[str, Any]], attempts: int = 5) -> str:
    """Patch one node with ``build(the node as read)``, read again where it changed meanwhile; '' when done, else
    why not (starting with MISSING where the node does not exist). launch/k8s/health_taint.py patches with it too."""
    for _ in range(attempts):
        try:
            api.patch_node(name, build(api.get_node(name)))
            return ""
        except urllib.error.HTTPError as exc:
            if exc.code == 409:  # changed since it was read: read it again
                continue
            detail = exc.read().decode(errors="replace")[:300]
            if exc.code == 404:
                return f"{MISSING} (a host expected by --expect-hosts that is not a node, or not spec.nodeName?)"
            if exc.code == 403:
                return (f"forbidden ({detail}): is label-nodes-rbac.yaml applied, with CG_NAMESPACE the Job's "
                        f"namespace?")
            return f"HTTP {exc.code}: {detail}"
        except (OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
    return f"the node kept changing: {attempts} patches conflicted"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the run's directory: the merge's host lists")
    parser.add_argument("--run", required=True, help="the run's name (the label and taint value)")
    parser.add_argument("--dry-run", action="store_true", help="print what each node gets, patch nothing")
    parser.add_argument("--api", default="", help="API server URL (default: in-cluster, KUBERNETES_SERVICE_HOST)")
    parser.add_argument("--token-file", type=Path, default=ACCOUNT / "token")
    parser.add_argument("--ca-file", default=str(ACCOUNT / "ca.crt"))
    args = parser.parse_args(argv)
    try:
        accepted, excluded, actions = read_hosts(args.run_dir)
    except OSError as exc:
        print(f"label_nodes: cannot read the merge's host lists in {args.run_dir}: {exc.strerror or exc} "
              f"(did the merge run?)", file=sys.stderr)
        return 2
    plan: list[tuple[str, str | None]] = [(h, None) for h in accepted] + list(excluded.items())
    if args.dry_run:
        for host, reason in plan:
            verdict = "accept" if reason is None else \
                f"excluded, taint {TAINT}={args.run}:NoSchedule ({reason}; {actions.get(host) or 'no action named'})"
            print(f"{host}: {VERDICT}={verdict}")
        return 0
    api_url = args.api or "https://{}:{}".format(os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc"),
                                                 os.environ.get("KUBERNETES_SERVICE_PORT", "443"))
    token = args.token_file.read_text().strip() if args.token_file.exists() else ""
    api = Api(api_url, token, args.ca_file if os.path.exists(args.ca_file) else None)
    failed = missing = 0
    for host, reason in plan:
        why = mark(api, host, args.run, reason, action=actions.get(host, ""))
        state = "accept" if reason is None else "excluded, tainted NoSchedule"
        if why:
            # A host the merge lists that is no Kubernetes node has nothing to mark: said, not a failure.
            missing += why.startswith(MISSING)
            failed += not why.startswith(MISSING)
            print(f"label_nodes: {host}: not marked {state}: {why}", file=sys.stderr)
        else:
            print(f"{host}: {VERDICT}={state}")
    print(f"label_nodes: {len(plan) - failed - missing} of {len(plan)} nodes marked ({len(accepted)} accepted, "
          f"{len(excluded)} excluded) for run {args.run}" + (f"; {missing} not Kubernetes nodes" if missing else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
