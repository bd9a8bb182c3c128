"""Put ``clustergate health``'s verdict on this Kubernetes node (health-daemonset.yaml's label-node container).

    python3 launch/k8s/health_taint.py /state/health.json --node NODE [--max-age 900] [--every 60] [--dry-run]

From the report ``clustergate health --report-dir`` keeps, it patches the node:

- label ``clustergate.io/health=healthy|unhealthy``;
- while not healthy: annotation ``clustergate.io/health-reason`` (the line a Slurm drain would carry:
  launch/health_reason.py) and the taint ``clustergate.io/unhealthy:NoSchedule``, so nothing new is scheduled
  there; once healthy again: that annotation and that taint removed.

A report older than ``--max-age`` seconds (the check stopped reporting) counts as not healthy; before any report
exists it waits as long before saying so. Only its own label, annotation and taint change: the merge's
``clustergate.io/excluded`` and every other taint stay. ``--every S`` marks again every S seconds, forever.
Standard library only; the API server and the token as label_nodes.py finds them (in-cluster). Exit status (one
pass): 0 marked, 1 the node could not be patched, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # launch/: health_reason.py
sys.path.insert(0, str(Path(__file__).resolve().parent))
from health_reason import health_reason  # noqa: E402
from label_nodes import ACCOUNT, REASON_CHARS, Api, apply  # noqa: E402

HEALTH, REASON, TAINT = "clustergate.io/health", "clustergate.io/health-reason", "clustergate.io/unhealthy"


def verdict(path: Path, max_age_s: float, waited_s: float) -> tuple[bool, str] | None:
    """(healthy, why not) from the report at ``path``; None where there is none yet and it is early to say so."""
    try:
        age = time.time() - path.stat().st_mtime
        report = json.loads(path.read_text())
    except FileNotFoundError:
        if waited_s < max_age_s:
            return None
        return False, f"clustergate: health: no report in {path} after {waited_s:.0f} s (is the health container up?)"
    except (OSError, ValueError) as exc:
        return False, f"clustergate: health: {path} cannot be read: {exc}"
    if age > max_age_s:
        return False, f"clustergate: health: the last report is {age:.0f} s old (more than {max_age_s:.0f} s)"
    if not isinstance(report, dict):
        return False, f"clustergate: health: {path} is not a health report"
    reason = health_reason(report)
    return not reason, reason


def patch_for(node: dict[str, Any], healthy: bool, reason: str) -> dict[str, Any]:
    """The merge patch that marks ``node`` (the object as read) healthy or not."""
    taints = [t for t in node.get("spec", {}).get("taints") or [] if t.get("key") != TAINT]
    if not healthy:
        taints.append({"key": TAINT, "effect": "NoSchedule"})
    return {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"],
                         "labels": {HEALTH: "healthy" if healthy else "unhealthy"},
                         "annotations": {REASON: None if healthy else reason[:REASON_CHARS]}},
            # A merge patch replaces a list whole: the node's other taints are written back as they were.
            "spec": {"taints": taints}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="clustergate health's report (DIR/health.json)")
    parser.add_argument("--node", required=True, help="this Kubernetes node's name (spec.nodeName)")
    parser.add_argument("--max-age", type=float, default=900.0, metavar="S",
                        help="a report older than this counts as not healthy (default 900)")
    parser.add_argument("--every", type=float, default=0.0, metavar="S", help="mark again every S seconds, forever")
    parser.add_argument("--dry-run", action="store_true", help="print what the node gets, patch nothing")
    parser.add_argument("--api", default="", help="API server URL (default: in-cluster, KUBERNETES_SERVICE_HOST)")
    parser.add_argument("--token-file", type=Path, default=ACCOUNT / "token")
    parser.add_argument("--ca-file", default=str(ACCOUNT / "ca.crt"))
    args = parser.parse_args(argv)
    api_url = args.api or "https://{}:{}".format(os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc"),
                                                 os.environ.get("KUBERNETES_SERVICE_PORT", "443"))
    started = time.monotonic()
    while True:
        seen = verdict(args.report, args.max_age, time.monotonic() - started)
        status = 0
        if seen is None:
            print(f"{args.node}: no report yet in {args.report}; not marked")
        elif args.dry_run:
            print(f"{args.node}: {HEALTH}={'healthy' if seen[0] else 'unhealthy'}"
                  + ("" if seen[0] else f", taint {TAINT}:NoSchedule ({seen[1]})"))
        else:
            token = args.token_file.read_text().strip() if args.token_file.exists() else ""
            api = Api(api_url, token, args.ca_file if os.path.exists(args.ca_file) else None)
            why = apply(api, args.node, lambda node: patch_for(node, *seen))  # noqa: B023 - used at once
            state = "healthy" if seen[0] else f"unhealthy, tainted NoSchedule: {seen[1]}"
            if why:
                print(f"health_taint: {args.node}: not marked {state}: {why}", file=sys.stderr)
                status = 1
            else:
                print(f"{args.node}: {HEALTH}={state}")
        sys.stdout.flush()
        if args.every <= 0:
            return status
        time.sleep(args.every)


if __name__ == "__main__":
    sys.exit(main())
