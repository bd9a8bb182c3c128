"""Why merge excludes a host, in one list: the causes, the one place they join their hosts (``join``), and what
merge says of each host it excludes: what to do about it (``clustergate.record.actions``), its evidence bundle
(``clustergate.record.evidence_bundle``), and what drifted on it.

A host's ``reasons`` name every cause, in this order (``clustergate.cluster.merge.judge_nodes`` takes the steps so;
each step but the first returns its ``Exclusion``s, host -> reason, and ``join`` adds them):

1. its own run (``node_runs.read_node``, ``missing_node``): no usable result, a run that is partial, unjudged or
   rejected, records that contradict its verdict, with its failures;
2. the node directories (``merge.gather``): two directories name the host; a host ``--expect-hosts`` does not name;
3. the cluster run (``binding.bind``): another run id, suite or profile, outside the window, GPUs without identities
   or shared with another host: ``unbound``, its figures left out of the fleet;
4. the fleet's skips (``merge.fleet_skips``): it skipped what the fleet ran: ``partial``;
5. the fleet's figures (``fleet.judge_outliers``): a part (a GPU, or the node) behind the fleet median;
6. the fleet's shape (``fleet.judge_shapes``): fewer GPUs than most nodes of its model;
7. the fleet's firmware (``firmware_fleet.exclusions``): a version other than the fleet's.

A host's steps are its own run's (each failure's category and action), then those the exclusions carry (each of its
parts the fleet found behind, each component off the fleet's firmware); a host without a usable result gets
``no_result``, one whose run cannot be taken as it stands (partial, another cluster run's, judged by other
thresholds, records that contradict its verdict) ``unusable_run`` besides its failures. Its action is the most
urgent of its steps'.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from clustergate.cluster.node_runs import Exclusion, NodeRun
from clustergate.criteria.criterion import Criterion
from clustergate.record import actions, evidence_bundle

NO_RESULT = ("missing", "running", "unreadable")
"""A node verdict that means merge had no usable result of it."""
NOT_AS_IT_STANDS = ("partial", "unjudged", "unbound")
"""A node verdict that means its run cannot be taken as it stands."""
EVIDENCE = "evidence"
"""The directory under merge's output that holds the bundles (evidence-HOST.tar.gz)."""


def join(runs: Iterable[NodeRun], found: Iterable[Exclusion]) -> None:
    """Each exclusion a step of merge ``found`` added to its host: its reason after those its host has, its verdict
    given (``unbound`` always; ``partial`` to a run that was accepted)."""
    by_host = {r.host: r for r in runs}
    for exclusion in found:
        run = by_host[exclusion.host]
        run.reasons.append(exclusion.reason)
        run.exclusions.append(exclusion)
        if exclusion.verdict == "unbound" or (exclusion.verdict == "partial" and run.verdict == "accept"):
            run.verdict = exclusion.verdict


def steps(run: NodeRun) -> list[actions.Step]:
    """Every step an excluded host calls for, most urgent first."""
    if run.results is None or run.verdict in NO_RESULT:
        return [actions.step("no_result")]
    own = actions.steps(run.results)
    failed = {s.test for s in own}  # a GPU its own run failed is behind the fleet too: one step says it
    found = [*own, *(e.step for e in run.exclusions if e.step is not None
                     and (e.step.test is None or e.step.test not in failed))]
    # A failure in a run that cannot be taken as it stands is still the hardware's; a run accepted by its
    # records but excluded for what merge found besides (not expected, named twice) says nothing broke.
    if run.verdict in NOT_AS_IT_STANDS or not found:
        found.append(actions.step("unusable_run"))
    return sorted(dict.fromkeys(found), key=lambda s: actions.URGENCY.index(s.action))


def entry(run: NodeRun) -> dict[str, Any]:
    """The cluster results.json ``excluded`` entry of an excluded host: its reasons, action and steps."""
    found = steps(run)
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
