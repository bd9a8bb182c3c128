"""What merge says of each host it excludes: what to do about it (``clustergate.record.actions``), its evidence bundle
(``clustergate.record.evidence_bundle``), and what drifted on it.

A host's steps are its own run's (each failure's category and action), then each of its GPUs the fleet found
behind (a fleet outlier); a host without a usable result gets ``no_result``, one whose run cannot be taken as
it stands (partial, another cluster run's, judged by other thresholds, records that contradict its verdict)
``unusable_run`` besides its failures. Its action is the most urgent of its steps'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clustergate.cluster.fleet import FleetMetric
from clustergate.cluster.node_runs import NodeRun
from clustergate.criteria.criterion import Criterion
from clustergate.record import actions, evidence_bundle

NO_RESULT = ("missing", "running", "unreadable")
"""A node verdict that means merge had no usable result of it."""
NOT_AS_IT_STANDS = ("partial", "unjudged", "unbound")
"""A node verdict that means its run cannot be taken as it stands."""
EVIDENCE = "evidence"
"""The directory under merge's output that holds the bundles (evidence-HOST.tar.gz)."""


def outlier_steps(host: str, fleet: list[FleetMetric]) -> list[actions.Step]:
    """A step for each metric on which one of ``host``'s parts (a GPU, or the node's own figure) fell behind the
    fleet (severity fail)."""
    out = []
    for fm in fleet:
        low = [o for o in fm.outliers if o["host"] == host and o["severity"] != "warn"]
        if low:
            gpus = ", ".join("the node" if o["gpu_index"] is None else f"gpu {o['gpu_index']}"
                             + (f" serial {o['gpu_serial']}" if o.get("gpu_serial") else "") for o in low)
            out.append(actions.step(actions.category_of_metric(fm.name), fm.nodeid,
                                    f"{host} {gpus}: fleet outlier"))
    return out


def steps(run: NodeRun, fleet: list[FleetMetric]) -> list[actions.Step]:
    """Every step an excluded host calls for, most urgent first."""
    if run.results is None or run.verdict in NO_RESULT:
        return [actions.step("no_result")]
    own = actions.steps(run.results)
    failed = {s.test for s in own}  # a GPU its own run failed is behind the fleet too: one step says it
    found = [*own, *(s for s in outlier_steps(run.host, fleet) if s.test not in failed)]
    # A failure in a run that cannot be taken as it stands is still the hardware's; a run accepted by its
    # records but excluded for what merge found besides (not expected, named twice) says nothing broke.
    if run.verdict in NOT_AS_IT_STANDS or not found:
        found.append(actions.step("unusable_run"))
    return sorted(dict.fromkeys(found), key=lambda s: actions.URGENCY.index(s.action))


def entry(run: NodeRun, fleet: list[FleetMetric]) -> dict[str, Any]:
    """The cluster results.json ``excluded`` entry of an excluded host: its reasons, action and steps."""
    found = steps(run, fleet)
    urgent = actions.most_urgent(found)
    return {"host": run.host, "phase": "node", "reasons": run.reasons, "action": urgent.value if urgent else None,
            "steps": [s.as_json() for s in found], "evidence": None}


def bundle(run: NodeRun, output: Path, thresholds: Path) -> str:
    """The host's evidence bundle, written under ``output/evidence/``; its path relative to ``output``.
    BundleError or OSError where it cannot be made."""
    if run.directory is None:
        raise evidence_bundle.BundleError(f"{run.host}: no node directory to bundle")
    where = output / EVIDENCE
    where.mkdir(exist_ok=True)
    made = evidence_bundle.build(Path(run.directory), where, thresholds=thresholds, host=run.host,
                                 reasons=tuple(run.reasons))
    return str(made.relative_to(output))


def drift_rows(results: dict[str, Any] | None) -> list[dict[str, Any]]:
    """What the node's own run found drifted (its ``drift`` section), each beside the criterion its metric is held
    to: the merged view's drift column."""
    drift = (results or {}).get("drift") or {}
    criteria = {(t.get("nodeid"), m.get("name")): Criterion.from_json(m.get("criterion")).text()
                for t in (results or {}).get("tests") or [] for m in t.get("metrics") or []}
    return [{"metric": d["metric"], "where": d.get("where", d.get("host", "")), "unit": d.get("unit", ""),
             "first": d["first"], "now": d["now"], "fraction": d["fraction"], "limit": d["limit"],
             "severity": d["severity"], "criterion": criteria.get((d.get("test"), d["metric"]), "")}
            for d in drift.get("findings") or []]
