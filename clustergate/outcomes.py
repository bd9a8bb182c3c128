"""Merge one test phase's outcome across ranks into one verdict every rank applies.

A test that fails on any rank fails on all, with "failed on k/N ranks" and each failing rank's
host and message, earliest first. Mixed outcomes without a failure (passed here, skipped there)
are a failure too: the ranks did not run the same test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clustergate.judge import Judged, Record, judge
from clustergate.thresholds import Profile

# Words in a failure that mean the default process group can no longer be trusted: a
# collective timed out or lost a peer, so ranks may disagree about which collective is next.
POISON_MARKERS = ("DistBackendError", "DistNetworkError", "DistStoreError", "Timed out", "timed out",
                  "Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted")


@dataclass(slots=True)
class PhaseOutcome:
    """What one rank saw in one phase (setup, call, teardown) of one test."""

    rank: int
    host: str
    outcome: str  # passed | failed | skipped
    message: str
    stop: float
    records: list[Record] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    gpu_label: str = ""


@dataclass(slots=True)
class PhaseVerdict:
    """The merged outcome every rank applies to its report."""

    outcome: str
    message: str
    failed_ranks: list[int]
    metrics: list[Judged] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    poisoned: bool = False


def _short_skip(message: str) -> str:
    return message.split("Skipped: ", 1)[-1].strip("')\" ")


def merge(outcomes: list[PhaseOutcome], profile: Profile, when: str, expected_metrics: tuple[str, ...]) -> PhaseVerdict:
    """Merge the phase outcomes of every rank, judging metrics in the call phase."""
    n = len(outcomes)
    failed = sorted((o for o in outcomes if o.outcome == "failed"), key=lambda o: (o.stop, o.rank))
    kinds = {o.outcome for o in outcomes}
    poisoned = any(marker in o.message for o in failed for marker in POISON_MARKERS)
    lines: list[str] = []
    if failed:
        lines.append(f"failed on {len(failed)}/{n} ranks: {', '.join(str(o.rank) for o in failed)}")
        for o in failed:
            lines.append(f"--- rank {o.rank} ({o.host}{', ' + o.gpu_label if o.gpu_label else ''}) ---")
            lines.append(o.message.rstrip())
    elif len(kinds) > 1:
        by_kind = {k: [o.rank for o in outcomes if o.outcome == k] for k in sorted(kinds)}
        lines.append("mixed outcomes across ranks (the ranks did not run the same test): "
                     + "; ".join(f"{k} on ranks {v}" for k, v in by_kind.items()))
        lines += [f"rank {o.rank}: {_short_skip(o.message)}" for o in outcomes if o.outcome == "skipped"]
    metrics: list[Judged] = []
    if when == "call":
        records = [r for o in outcomes for r in o.records]
        metrics = judge(records, profile)
        missing = [m for m in expected_metrics if m not in {r.name for r in records}]
        if kinds == {"passed"} and missing:
            lines.append(f"declared metrics never recorded: {', '.join(missing)} "
                         "(a test that measures nothing cannot pass)")
        bad = [f for j in metrics for f in j.failures]
        if bad:
            lines.append(f"{len(bad)} metric check{'s' if len(bad) > 1 else ''} failed:")
            lines += [f"  {f}" for f in bad]
    outcome = "failed" if lines else kinds.pop()
    message = outcomes[0].message if outcome == "skipped" else "\n".join(lines)
    failed_ranks = [o.rank for o in failed]
    if outcome == "failed" and not failed_ranks:
        failed_ranks = sorted({p["rank"] for j in metrics for p in j.per_rank if not p["passed"]})
    return PhaseVerdict(outcome=outcome, message=message, failed_ranks=failed_ranks, metrics=metrics,
                        details=outcomes[0].details, poisoned=poisoned)
