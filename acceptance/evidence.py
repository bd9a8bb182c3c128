"""What the error-evidence tests share: the snapshot kept from before the first load test to after the
last, and one way to judge what grew in between, part by part.

``error_baseline`` is a session fixture (acceptance/conftest.py imports it): test_errors_before.py
fills it, the tests of test_errors_after.py read it, and its teardown stops the NVML XID watcher.
``settle_parts`` judges each part (a GPU, a PCI device, an InfiniBand port) alone with the plugin's
own judge against the profile, so a failure names the part, the counter with both values and the
next step, and the plugin judges the same figures again from what was recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

from clustergate.record.judge import Record, Where, judge
from clustergate.run.recorder import Recorder
from workloads import faults
from workloads.counters import Change, grown
from workloads.gpu.error_counters import GPU_PART
from workloads.node.discovery import host_root  # noqa: F401 - the acceptance tests import it from here
from workloads.result import Result

BEFORE_TEST = "acceptance/test_errors_before.py::test_error_counters_before_load"


@dataclass(slots=True)
class Baseline:
    """This rank's snapshot from before the load tests."""

    taken: bool = False
    t0: float = 0.0
    """time.monotonic() of the snapshot: rates are per second (or minute) of the run."""
    gpu: dict[str, Any] | None = None
    """workloads.gpu.error_counters.read_device of this rank's GPU (None on a CPU rank)."""
    node: dict[str, Any] | None = None
    """On a node's local rank 0: AER, InfiniBand and kernel-log snapshots of the node."""
    watcher: Any = None
    """The XidWatcher of this rank's GPU, or why there is none."""


@pytest.fixture(scope="session")
def error_baseline() -> Iterator[Baseline]:
    state = Baseline()
    yield state
    stop = getattr(state.watcher, "stop", None)
    if stop is not None:
        stop()


def is_node_reader(cg: Recorder) -> bool:
    """Node-wide counters are read by each node's local rank 0."""
    return cg.identities[cg.rank]["local_rank"] == 0


def require_baseline(cg: Recorder, state: Baseline) -> None:
    cg.skip_unless_everywhere(state.taken, f"no snapshot from before the load tests: {BEFORE_TEST} was not "
                                           "selected (-k/-m) or did not run, so growth cannot be measured",
                              fact=None)  # a complete run always takes the snapshot


def where_of(cg: Recorder, rank: int) -> Where:
    ident = cg.identities[rank]
    gpu = ident.get("gpu") or {}
    return Where(rank=rank, host=ident["host"], node_rank=ident["node_rank"], gpu_index=gpu.get("index"),
                 gpu_serial=gpu.get("serial"), gpu_uuid=gpu.get("uuid"))


def gpu_label(cg: Recorder, rank: int) -> str:
    return where_of(cg, rank).label("gpu")


@dataclass(frozen=True, slots=True)
class Part:
    """One part's figure for one metric, and the evidence behind it."""

    metric: str
    owner: int
    """The rank that records it and fails when it misses (the GPU's rank; a node's local rank 0)."""
    scope: str
    label: str
    value: float
    unit: str
    category: str
    evidence: tuple[str, ...] = ()


def counter_parts(metrics: dict[str, tuple[tuple[str, ...], str]], changes: list[Change], *, owner: int,
                  scope: str, label: str) -> tuple[list[Part], list[str]]:
    """(a Part per metric from the growth of its counters, the metrics none of whose counters was read)."""
    parts, missing = [], []
    for metric, (names, category) in metrics.items():
        mine = [c for c in changes if c.counter in names]
        if not mine:
            missing.append(metric)
            continue
        # name the part where the label does not already (a GPU's NVLink, not its board counters)
        said = tuple(("" if c.part == GPU_PART or label.startswith(c.part) else f"{c.part}: ") + c.text()
                     for c in grown(mine))
        parts.append(Part(metric, owner, scope, label, float(sum(c.delta or 0 for c in mine)), "count", category, said))
    return parts, missing


@dataclass(slots=True)
class Verdicts:
    """What ``settle_parts`` decided, for the caller's details."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[int, list[str]] = field(default_factory=dict)


def judge_parts(cg: Recorder, parts: list[Part]) -> Verdicts:
    """Each part alone against the profile, through the plugin's judge: the same rule, the same words."""
    out = Verdicts()
    for p in parts:
        [j] = judge([Record(p.metric, p.value, p.unit, p.scope, "", where_of(cg, p.owner))], cg.profile)
        status = "ok" if j.passed else "fail"
        step = faults.next_step(p.category)
        out.rows.append({**asdict(p), "where": where_of(cg, p.owner).label(p.scope), "status": status,
                         "criterion": j.criterion, "next_step": step if status == "fail" or p.evidence else ""})
        if status == "fail":
            said = "; ".join(p.evidence) or f"{p.metric} = {p.value:g}"
            out.failures.setdefault(p.owner, []).append(f"{j.failures[0]}: {p.label}: {said}. Next step: {step}")
    return out


def settle_parts(cg: Recorder, title: str, parts: list[Part], unreadable: dict[str, str],
                 broken: dict[int, list[str]] | None = None, unreadable_fact: str = "unsupported") -> None:
    """Record, judge and decide, alike on every rank (every rank holds every part).

    Each owner records its worst figure per metric; a part that misses fails its owner (and so the test,
    on every rank); ``broken`` are failures that are not a figure (a GPU NVML could read before the run
    and not after). Where some part could not be read (``unreadable``: where -> why) and nothing failed,
    the test skips saying why, on ``unreadable_fact`` (``decide``): an unread counter is never a pass.
    """
    verdicts = judge_parts(cg, parts)
    for owner, lines in (broken or {}).items():
        verdicts.failures.setdefault(owner, []).extend(lines)
    cg.record_result(Result(metrics=(), details={
        "evidence": verdicts.rows, "unreadable": unreadable,
        "tables": {title: [{k: r[k] for k in ("where", "label", "metric", "value", "status")}
                           | {"evidence": "; ".join(r["evidence"])} for r in verdicts.rows if r["value"] > 0]},
    }))
    worst: dict[tuple[str, str, str], float] = {}
    for p in parts:
        if p.owner == cg.rank:
            key = (p.metric, p.unit, p.scope)
            worst[key] = max(worst.get(key, p.value), p.value)
    for (metric, unit, scope), value in worst.items():
        cg.record(metric, value, unit, scope=scope)  # type: ignore[arg-type]
    decide(cg, title, verdicts.failures, unreadable, unreadable_fact)


def decide(cg: Recorder, title: str, failures: dict[int, list[str]], unreadable: dict[str, str],
           unreadable_fact: str = "unsupported") -> None:
    """The same on every rank: a rank with failures fails naming them; with none anywhere, anything that
    could not be read makes the test skip saying what and why (never a pass), on ``unreadable_fact``: the node
    does not offer it (a fleet whose other nodes ran the test says otherwise: ``clustergate.trust.completeness``)."""
    mine = failures.get(cg.rank)
    if mine:
        pytest.fail(f"{title}:\n  " + "\n  ".join(mine), pytrace=False)
    if any(failures.values()):
        return  # the owners fail the test, naming their parts
    if unreadable:
        first = next(iter(unreadable.items()))
        cg.skip(f"{title}: not readable on {len(unreadable)} part(s), e.g. {first[0]}: {first[1]}",
                fact=unreadable_fact)
