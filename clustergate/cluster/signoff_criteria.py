"""The sign-off's table of criteria: every criterion the accepted fleet was held to, with its figures across it.

One row per metric of each test, of each phase: the node phase's figures come from the fleet the sign-off judged
again from the node files (``clustergate.cluster.fleet``: each part a GPU or a node, the figures merge judged; the
merged record keeps only their distribution), kept to the hosts the sign-off accepts; the fabric phase's from the
fabric run's per-part figures of those hosts (a whole-job figure is the job's one). The figures are computed here
once; ``clustergate.report.signoff_html`` only draws them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from clustergate.cluster.fleet import FleetMetric
from clustergate.criteria.criterion import Criterion


def _row(phase: str, metric: str, test: str, unit: str, scope: str, criterion: dict[str, Any],
         values: list[float]) -> dict[str, Any]:
    rule = Criterion.from_json(criterion)
    said = rule.describe()
    # The worst part is the one the bound is nearest to: the lowest against a minimum, the highest against a maximum.
    worst = max(values) if rule.higher_is_better is False else min(values)
    return {"phase": phase, "metric": metric, "test": test, "unit": unit, "scope": scope, "parts": len(values),
            "min": min(values), "median": statistics.median(values), "max": max(values), "worst": worst,
            "margin_pct": rule.margin_pct(worst), "criterion": said["criterion"], "severity": said["severity"],
            "source": said["source"], "judged": rule.judged}


def node_phase(fleet: Iterable[FleetMetric], accepted: set[str]) -> list[dict[str, Any]]:
    """The fleet's metrics, each over the accepted hosts' parts (a metric none of them recorded: no row)."""
    rows = []
    for fm in fleet:
        values = [s.value for s in fm.samples if s.host in accepted]
        if values:
            rows.append(_row("node", fm.name, fm.nodeid, fm.unit, fm.scope, dict(fm.criterion), values))
    return rows


def fabric_phase(fabric: dict[str, Any], accepted: set[str]) -> list[dict[str, Any]]:
    """The fabric run's metrics over the accepted hosts' parts; a whole-job figure is the job's one figure."""
    rows = []
    for test in fabric.get("tests") or []:
        for m in test.get("metrics") or []:
            scope = str(m.get("scope") or "gpu")
            if scope == "world" or not m.get("per_rank"):
                values = [float(m["value"])]
            else:
                values = [float(p["value"]) for p in m["per_rank"] if str(p.get("host")) in accepted]
            if values:
                rows.append(_row("fabric", str(m["name"]), str(test["nodeid"]), str(m.get("unit") or ""), scope,
                                 dict(m.get("criterion") or {}), values))
    return rows


def criteria(fleet: Iterable[FleetMetric], fabric: dict[str, Any] | None,
             accepted: list[str]) -> list[dict[str, Any]]:
    """signoff.json's ``criteria``: the node phase's rows (``fleet``: the node phase judged again), then the fabric
    phase's, each by metric name."""
    hosts = set(accepted)
    node = sorted(node_phase(fleet, hosts), key=lambda r: (r["metric"], r["test"]))
    net = sorted(fabric_phase(fabric or {}, hosts), key=lambda r: (r["metric"], r["test"]))
    return node + net
