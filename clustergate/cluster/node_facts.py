"""What merge keeps of a node file once it is read: the facts the verdict, the exclusions and the fleet figures need,
not the file's detail.

A node's results.json is a few hundred KB (sweeps, clocks, loss curves, discovery, a figure per GPU per metric); a
merge of 10,000 held them all and needed 8 GB. Each file is read once (``clustergate.cluster.node_runs.read_node``
judges it whole), its figures go into the fleet (``clustergate.cluster.fleet.Collector``), and what stays is
``slim``: the record's own facts (identity, inventory, environment, attestation, selection, drift, warnings: every
top-level section but ``tests``) and of each test what the later steps read: its outcome, phases and skip facts
(the fleet's skips, ``clustergate.trust.completeness.fleet_problems``), and for a test that did not pass its
metrics and evidence too (the host's steps, ``clustergate.record.actions.steps``). A node's own failure lines and
drift rows are said when it is read (``keep``), while its messages are there. The merged record references each
node file (its directory and digest) for anything else.
"""

from __future__ import annotations

import sys
from typing import Any

from clustergate.cluster import firmware_fleet
from clustergate.cluster.excluded import drift_rows
from clustergate.cluster.node_runs import NodeRun, failed_tests

KEPT = ("nodeid", "outcome", "phases", "skip_fact", "duration_s")
"""All that a test that passed or was skipped keeps: what the fleet's skips read (its id, outcome, the phases it ran
and the fact it skipped on) and its time; no later step of merge reads the rest (its details, message, metrics,
captured output)."""
NOT_PASSED = ("failed", "error", "interrupted")
"""Outcomes whose metrics and evidence stay: the host's steps name what failed and where."""


def _test(test: dict[str, Any]) -> dict[str, Any]:
    if test.get("outcome") in NOT_PASSED:
        out = {sys.intern(k): v for k, v in test.items() if k not in ("details", "message")}
        evidence = (test.get("details") or {}).get("evidence") if isinstance(test.get("details"), dict) else None
        if evidence:
            out["details"] = {"evidence": evidence}
        return out
    # Keys, test ids, outcomes and phases are the same in every node file: one string each across the fleet, not one
    # per node (a healthy node's kept tests were 40 of the 96 KB it held).
    out = {k: _shared(test[k]) for k in KEPT if k in test}
    if isinstance(out.get("phases"), list):
        out["phases"] = [_shared(phase) for phase in out["phases"]]
    return out


def _shared(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def slim(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` without the detail no step after the read needs (see the module's docstring)."""
    out = {sys.intern(k): v for k, v in results.items() if k != "tests"}
    out["tests"] = [_test(t) for t in results.get("tests") or [] if isinstance(t, dict)]
    return out


def keep(run: NodeRun) -> None:
    """``run`` as merge keeps it past its read: its failure lines and drift rows said now, its results slimmed."""
    if run.results is not None:
        run.failed = failed_tests(run.results)
        run.drift = drift_rows(run.results)
        run.firmware = firmware_fleet.node_versions(run.results)  # read from tests' details, which slim drops
        run.results = slim(run.results)
    if run.unjudged is not None:
        run.unjudged = slim(run.unjudged)
