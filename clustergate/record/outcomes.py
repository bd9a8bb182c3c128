"""Merge one test phase's outcome across ranks into one verdict every rank applies.

A test that fails on any rank fails on all, with "failed on k/N ranks" and each failing rank's
host and message, earliest first. Mixed outcomes without a failure (passed here, skipped there)
are a failure too: the ranks did not run the same test.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from clustergate.criteria.thresholds import Profile
from clustergate.record.judge import Judged, Record, Where, judge, record_problems

DIST_ERRORS = ("DistBackendError", "DistNetworkError", "DistStoreError")
"""torch.distributed's own error types (NCCL errors and timeouts, a lost store or peer)."""
LOST_PEER = ("Timed out", "timed out", "Connection closed by peer", "Connection reset by peer",
             "NCCL communicator was aborted")
"""gloo reports a lost collective as a plain RuntimeError whose own words say which."""


def poisons(exc: BaseException | None) -> bool:
    """Whether ``exc``, raised on this rank, leaves the workloads' process group unusable: a collective
    timed out or lost a peer, so ranks may disagree about which collective comes next.

    Decided once, on the rank where it was raised, from the exception and its causes (a workload
    may wrap it): never from the text of merged messages, which quote other ranks and test output.
    """
    import torch.distributed as dist  # here, not at import: the report command imports this module without torch

    kinds = tuple(k for k in (getattr(dist, name, None) for name in DIST_ERRORS) if isinstance(k, type))
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, kinds):
            return True
        if type(exc) is RuntimeError and any(marker in str(exc) for marker in LOST_PEER):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def metric_block(failures: list[str]) -> str:
    """The failure text of a test's missed criteria: a header line, then one indented line each."""
    return f"{len(failures)} metric check{'s' if len(failures) > 1 else ''} failed:\n" + \
        "\n".join(f"  {f}" for f in failures)


def expect(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """``value`` if it is of ``kind``; TypeError naming ``what`` otherwise (a control message's shape check)."""
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise TypeError(f"{what} must be a number, not a bool")
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise TypeError(f"{what} must be {names}, not {type(value).__name__}")
    return value


def _fields_of(cls: type, message: Any, what: str) -> dict[str, Any]:
    """A message's fields for dataclass ``cls``: every field present, no other."""
    expect(message, dict, what)
    names = {f.name for f in fields(cls)}
    if set(message) != names:
        missing, extra = sorted(names - set(message)), sorted(set(message) - names)
        raise KeyError(f"{what}: missing {missing}, unexpected {extra}")
    return message


def _record(message: Any) -> Record:
    d = dict(_fields_of(Record, message, "a record"))
    where = _fields_of(Where, d["where"], "a record's where")
    for key in ("name", "unit", "scope", "description"):
        expect(d[key], str, f"record.{key}")
    expect(d["value"], (int, float), "record.value")
    expect(where["rank"], int, "where.rank")
    expect(where["host"], str, "where.host")
    return Record(**{**d, "where": Where(**where)})


def _judged(message: Any) -> Judged:
    d = _fields_of(Judged, message, "a judged metric")
    expect(d["name"], str, "metric.name")
    expect(d["passed"], bool, "metric.passed")
    expect(d["criterion"], dict, "metric.criterion")
    for key in ("failures", "per_rank", "warnings"):
        expect(d[key], list, f"metric.{key}")
    return Judged(**d)


def _plain(details: dict[str, Any]) -> dict[str, Any]:
    """A test's details as JSON carries them (what results.json will say of them anyway)."""
    return json.loads(json.dumps(details, default=str))


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
    poisoned: bool = False
    """This rank's exception left the process group unusable (``poisons``)."""
    said: str = ""
    """The failure or skip in one line, taken from the exception itself (``ValueError: ...``, the skip's
    reason), never read back out of ``message``: what the other ranks are told and the mixed-outcome line shows."""
    fact: dict[str, Any] | None = None
    """The fact a skip rests on (``clustergate.trust.skip_facts``), as the skip carried it; None for any other
    outcome."""

    def as_message(self) -> dict[str, Any]:
        """What travels to rank 0 (JSON)."""
        return {**asdict(self), "details": _plain(self.details)}

    @classmethod
    def from_message(cls, message: Any) -> PhaseOutcome:
        """The outcome a rank sent; TypeError or KeyError when it is not of this shape."""
        d = dict(_fields_of(cls, message, "a phase outcome"))
        expect(d["rank"], int, "outcome.rank")
        expect(d["outcome"], str, "outcome.outcome")
        for key in ("host", "message", "gpu_label", "said"):
            expect(d[key], str, f"outcome.{key}")
        expect(d["stop"], (int, float), "outcome.stop")
        expect(d["poisoned"], bool, "outcome.poisoned")
        expect(d["details"], dict, "outcome.details")
        expect(d["fact"], (dict, type(None)), "outcome.fact")
        d["records"] = [_record(r) for r in expect(d["records"], list, "outcome.records")]
        return cls(**d)


@dataclass(slots=True)
class PhaseVerdict:
    """The merged outcome every rank applies to its report."""

    outcome: str
    message: str
    failed_ranks: list[int]
    metrics: list[Judged] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    poisoned: bool = False
    problems: list[str] = field(default_factory=list)
    """What failed besides the metrics' criteria (a rank raised, outcomes differ, a record is missing):
    ``message`` is these lines, then the metric block."""
    fact: dict[str, Any] | None = None
    """The fact a skip rests on (rank 0's: every rank skips alike); None unless the outcome is skipped."""

    def as_message(self) -> dict[str, Any]:
        """What rank 0 sends every rank (JSON)."""
        return {**asdict(self), "details": _plain(self.details)}

    @classmethod
    def from_message(cls, message: Any) -> PhaseVerdict:
        """The verdict rank 0 sent; TypeError or KeyError when it is not of this shape."""
        d = dict(_fields_of(cls, message, "a phase verdict"))
        expect(d["outcome"], str, "verdict.outcome")
        expect(d["message"], str, "verdict.message")
        expect(d["poisoned"], bool, "verdict.poisoned")
        expect(d["details"], dict, "verdict.details")
        expect(d["fact"], (dict, type(None)), "verdict.fact")
        d["failed_ranks"] = [expect(r, int, "verdict.failed_ranks[]") for r in expect(d["failed_ranks"], list,
                                                                                    "verdict.failed_ranks")]
        d["problems"] = [expect(p, str, "verdict.problems[]") for p in expect(d["problems"], list, "verdict.problems")]
        d["metrics"] = [_judged(m) for m in expect(d["metrics"], list, "verdict.metrics")]
        return cls(**d)


def merge(outcomes: list[PhaseOutcome], profile: Profile, when: str, expected_metrics: tuple[str, ...]) -> PhaseVerdict:
    """Merge the phase outcomes of every rank, judging metrics in the call phase."""
    n = len(outcomes)
    failed = sorted((o for o in outcomes if o.outcome == "failed"), key=lambda o: (o.stop, o.rank))
    kinds = {o.outcome for o in outcomes}
    poisoned = any(o.poisoned for o in failed)
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
        lines += [f"rank {o.rank}: {o.said}" for o in outcomes if o.outcome == "skipped"]
    metrics: list[Judged] = []
    bad: list[str] = []
    record_ranks: list[int] = []
    if when == "call":
        records = [r for o in outcomes for r in o.records]
        metrics = judge(records, profile)
        missing = [m for m in expected_metrics if m not in {r.name for r in records}]
        if kinds == {"passed"} and missing:
            lines.append(f"declared metrics never recorded: {', '.join(missing)} "
                         "(a test that measures nothing cannot pass)")
        said, record_ranks = record_problems(records, {o.rank: o.host for o in outcomes if o.outcome == "passed"})
        lines += said
        bad = [f for j in metrics for f in j.failures]
    outcome = "failed" if lines or bad else kinds.pop()
    # A skip says its reason alone: pytest's own text of it is a (path, line, "Skipped: ...") tuple's repr.
    skipped = outcomes[0].said or outcomes[0].message
    message = skipped if outcome == "skipped" else "\n".join(lines + ([metric_block(bad)] if bad else []))
    failed_ranks = [o.rank for o in failed]
    if outcome == "failed" and not failed_ranks:
        failed_ranks = sorted(set(record_ranks) | {p["rank"] for j in metrics for p in j.per_rank if not p["passed"]})
    return PhaseVerdict(outcome=outcome, message=message, failed_ranks=failed_ranks, metrics=metrics,
                        details=outcomes[0].details, poisoned=poisoned, problems=lines,
                        fact=outcomes[0].fact if outcome == "skipped" else None)
