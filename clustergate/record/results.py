"""results.json (schema 1): the machine-readable verdict, kept up to date as the run goes.

Rank 0 owns it. It exists from the start of the session and says "running" until the run has
finished cleanly (every selected test ran on every rank, every output written, all ranks agreed):
only then can it say "accept". A run that is interrupted or fails says "reject" with ``error``
saying why; one killed outright leaves "running", which no gate reads as accepted. Every write is
atomic, strict JSON (no NaN or Infinity) and redacted (``clustergate.secrets.redact``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clustergate.common.files import write_atomic
from clustergate.record import actions
from clustergate.record.judge import warnings
from clustergate.record.outcomes import PhaseVerdict
from clustergate.record.verdict import Verdict, decide
from clustergate.secrets import redact as redact_mod
from clustergate.secrets.redact import redact
from clustergate.trust import completeness, keyed
from clustergate.trust import manifest as suite_manifest

SCHEMA = 1
RUN_ID_ENV = "CLUSTERGATE_RUN_ID"
"""The cluster run a node or fabric run belongs to (RUN_ID of REPORTS/RUN_ID/nodes/HOST), set by the launchers:
merge and sign-off take only the parts that carry their run's id."""


@dataclass(slots=True)
class TestEntry:
    nodeid: str
    outcome: str = "passed"
    duration_s: float = 0.0
    failed_ranks: list[int] = field(default_factory=list)
    message: str = ""
    metrics: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """What failed besides the metrics' criteria, one entry a phase: the message without its metric block
    (``clustergate render`` re-judges the metrics and keeps these)."""
    phases: list[str] = field(default_factory=list)
    """The phases that ran (setup, call, teardown): a test that passed without a call phase never ran its body
    (``--setup-only``), so it measured nothing (``clustergate.trust.completeness``)."""
    skip_fact: dict[str, Any] | None = None
    """The fact a skipped test rests on (``clustergate.trust.skip_facts``); None for a test that did not skip."""

    def note(self, text: str) -> None:
        """A failure that is not a metric's: added to ``problems`` and the message."""
        self.problems.append(text)
        self.message = f"{self.message}\n{text}".strip()

    def apply(self, when: str, verdict: PhaseVerdict, duration_s: float) -> None:
        """Fold one phase's merged verdict into the test's entry."""
        self.phases.append(when)
        self.duration_s += duration_s
        if when == "call":
            self.metrics = [m.as_json() for m in verdict.metrics]
            self.details = verdict.details
        if verdict.outcome == "failed":
            self.outcome = "failed" if when == "call" else "error"
            self.failed_ranks = sorted(set(self.failed_ranks) | set(verdict.failed_ranks))
            self.message = f"{self.message}\n[{when}] {verdict.message}".strip()
            if verdict.problems:
                self.problems.append(f"[{when}] " + "\n".join(verdict.problems))
        elif verdict.outcome == "skipped" and self.outcome == "passed":
            self.outcome = "skipped"
            self.message = verdict.message
            self.skip_fact = verdict.fact


@dataclass(slots=True)
class RunRecord:
    """Everything results.json says; filled in as the run goes."""

    profile: str
    level: str
    world_size: int
    sign_off: bool = True
    started: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    t0: float = field(default_factory=time.monotonic)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    tests: dict[str, TestEntry] = field(default_factory=dict)
    error: str | None = None
    """A run-level failure (interrupted, lost rank, collection mismatch, timeout, failed write): forces
    "reject". The first one is kept: later ones are consequences of it."""
    finished: bool = False
    """Set once the run has ended cleanly on every rank; until then the verdict is at best "running"."""
    selection: dict[str, Any] = field(default_factory=dict)
    """What this run was asked to run: -k, -m, --level, selected and deselected counts."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Further top-level sections other parts add (e.g. "baseline", "discovery")."""
    run_id: str | None = field(default_factory=lambda: os.environ.get(RUN_ID_ENV) or None)
    """The cluster run this run is a part of (``CLUSTERGATE_RUN_ID``); None for a run on its own."""
    limits: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each collected test's time limit and where it came from (``clustergate.run.testlimit.TimeLimit``): a test's
    ``limit`` in results.json."""

    def __post_init__(self) -> None:
        redact_mod.keep(self.run_id)  # the run's own name: never scrubbed, or merge could not match it

    def test(self, nodeid: str) -> TestEntry:
        return self.tests.setdefault(nodeid, TestEntry(nodeid))

    def fail(self, error: str) -> None:
        """Record a run-level failure unless an earlier one already explains the ending."""
        if self.error is None:
            self.error = error

    @property
    def decision(self) -> Verdict:
        outcomes = [t.outcome for t in self.tests.values()]
        partial = completeness.partial(self._coverage(), suite_manifest.shipped()) if self.finished else []
        return decide(outcomes, error=self.error, finished=self.finished, sign_off=self.sign_off, partial=partial)

    def _coverage(self) -> dict[str, Any]:
        """What the completeness rule reads of the record (tests, phases, skip facts, selection, nodes, ranks,
        level, environment, and the discovery and attestation sections)."""
        return {"tests": [{"nodeid": t.nodeid, "outcome": t.outcome, "phases": t.phases, "skip_fact": t.skip_fact}
                          for t in self.tests.values()],
                "selection": self.selection, "nodes": self.nodes, "level": self.level, "world_size": self.world_size,
                "environment": self.environment, "discovery": self.extra.get("discovery"),
                "attestation": self.extra.get("attestation")}

    @property
    def verdict(self) -> str:
        return self.decision.verdict

    def as_json(self, only_test: str | None = None) -> dict[str, Any]:
        """The record as every output shows it: redacted here, once, for all of them.

        ``only_test``: the run with that one test in ``tests`` (none if it has no entry), for a view of one
        test while the run goes on; redacting every test for each of them costs tests x tests."""
        decision = self.decision
        tests = [
            {"nodeid": t.nodeid, "outcome": t.outcome, "duration_s": round(t.duration_s, 3),
             "failed_ranks": t.failed_ranks, "message": t.message, "problems": t.problems,
             "phases": t.phases, "skip_fact": t.skip_fact, "metrics": t.metrics, "details": t.details,
             **({"limit": self.limits[t.nodeid]} if t.nodeid in self.limits else {})}
            for t in self.tests.values() if only_test is None or t.nodeid == only_test
        ]
        record = {
            "schema": SCHEMA,
            "verdict": decision.verdict,
            "reason": decision.reason,
            "profile": self.profile,
            "sign_off": self.sign_off,
            "level": self.level,
            "started": self.started,
            "run_id": self.run_id,
            "duration_s": round(time.monotonic() - self.t0, 3),
            "world_size": self.world_size,
            "error": self.error,
            "selection": self.selection,
            "nodes": self.nodes,
            "environment": self.environment,
            "warnings": warnings(tests, self.extra.get("drift")),
            "tests": tests,
            **self.extra,
        }
        record["actions"] = actions.section(record)
        return redact(record)


def nodes_from_identities(identities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group per-rank identities into the results.json ``nodes`` list."""
    nodes: dict[int, dict[str, Any]] = {}
    for ident in sorted(identities, key=lambda i: i["rank"]):
        node = nodes.setdefault(ident["node_rank"], {"host": ident["host"], "node_rank": ident["node_rank"],
                                                     "ranks": [], "gpus": []})
        node["ranks"].append(ident["rank"])
        if ident.get("gpu"):
            node["gpus"].append({**ident["gpu"], "rank": ident["rank"], "local_rank": ident["local_rank"]})
    return [nodes[k] for k in sorted(nodes)]


def short_test_name(nodeid: str) -> str:
    """A test as every text names it in a line: its function and parameters, without the file
    (``test_matmul_tflops[bf16]``)."""
    return nodeid.rsplit("::", 1)[-1]


def selection_line(results: dict[str, Any]) -> str | None:
    """"N of M tests selected (-k ..., -m ..., level L)" for the terminal and the report; None if unknown."""
    sel = results.get("selection") or {}
    if sel.get("selected") is None:
        return None
    total = sel["selected"] + (sel.get("deselected") or 0)
    how = [f"-k {sel['k']!r}" if sel.get("k") else "", f"-m {sel['m']!r}" if sel.get("m") else "",
           f"level {sel['level']}" if sel.get("level") else ""]
    return f"{sel['selected']} of {total} tests selected ({', '.join(h for h in how if h)})"


def encode(data: dict[str, Any]) -> str:
    """results.json text: redacted, strict JSON (ValueError on NaN or Infinity: no reader accepts them)."""
    return json.dumps(redact(data), indent=2, default=str, allow_nan=False) + "\n"


def signed(data: dict[str, Any], key: bytes, host: str) -> dict[str, Any]:
    """``data`` as it is written (redacted, plain JSON), signed with the site key on ``host``
    (``clustergate.trust.keyed``): the HMAC covers exactly what a reader reads back."""
    out = keyed.sign(json.loads(encode(data)), key, host)
    value = out[keyed.FIELD]["value"]
    if redact(value) != value:  # the record's own: never taken for a secret (rarely needed: kept only then)
        redact_mod.keep(value)
    return out


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: readers never see half a file (a failed write leaves the previous one). Through
    a temporary file of a random name (``clustergate.common.files.write_atomic``): a link planted as results.json.tmp,
    or as results.json itself, is never written through."""
    write_atomic(path, encode(data))
